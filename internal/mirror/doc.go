// Package mirror is kelp's embedded peer-to-peer registry mirror: nodes
// pull the images of the registries they opt in (registries.yaml) from
// each other before the registry, as k3s does with Spegel.
//
// Each node serves two faces of one port. On its own IP, Registry answers
// the pull requests of the OCI distribution API (manifests and blobs by
// digest, of the images of the registries the node shares) from the
// node's containerd, to other nodes only: TLS with a node's certificate of
// the cluster's client CA, both ways. On 127.0.0.1, Mirror answers the
// node's own containerd, and no other user's process: it asks the other
// nodes which has the content of a digest and passes it on from one that
// has, checked against the digest, or answers 404 so that containerd goes
// on to the registry. Tags are the registry's alone to resolve.
package mirror
