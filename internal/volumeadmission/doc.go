// Package volumeadmission is the admission webhook that keeps a node's
// controllers from binding other nodes' claims: a node may create a
// volume only for a claim the scheduler placed on it.
//
// The local-path provisioner of each node creates its volumes pre-bound
// (spec.claimRef) to their claims, and the controller-manager binds a
// claim to a volume pre-bound to it before anything else, whatever node
// the volume lives on: the claim's pod then follows the volume. The
// admission policies (package systemobjects) keep each node to volumes of
// its own node but cannot look a claim up, so a node could pre-bind a
// volume of its own to any pending claim of any namespace and pull the
// claim's pod, and its data, to itself. This webhook looks the claim up:
// a volume a node's controllers create must name a claim that exists with
// that UID, is not bound, is of a class the local-path provisioner serves,
// and was placed on that node by the scheduler
// (volume.kubernetes.io/selected-node).
//
// Every server serves it on loopback (Port), with the apiserver's own
// serving certificate, reloaded when it is renewed, and the apiservers
// call the kelp beside them: the webhook configuration names
// https://127.0.0.1 and is sent only the requests of nodes' controllers.
package volumeadmission
