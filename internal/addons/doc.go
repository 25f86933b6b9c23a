// Package addons applies the manifests directory (<data-dir>/server/manifests)
// to the cluster and keeps it applied: kelp's built-in manifests, rendered
// there at every start, and the user's.
//
// Each file NAME.yaml, NAME.yml or NAME.json (YAML documents separated by
// "---", or JSON; a List's items count as objects) is one Addon object,
// kube-system/NAME of kind Addon in kelp.io/v1, in the manner of k3s. Its
// spec records the file and the sha256 of the content last applied in
// full; its status lists the objects applied from it. The objects are
// applied with server-side apply under the field manager "kelp", forced.
//
// A file is applied at start, within a second of a change, and at a
// periodic resync when its checksum differs from the one its Addon
// records, so an idle directory costs the datastore no writes. An object
// that leaves a file is deleted when the file is next applied in full; a
// file that leaves the directory takes its objects and its Addon with it.
// NAME.yaml.skip beside NAME.yaml keeps kelp's hands off that file: it is
// neither applied nor pruned, nor rewritten if it is a built-in.
//
// A file that cannot be read, parsed or applied is reported by name: in
// kelp's log, in its Addon's Applied condition and as an event on the
// Addon. The other files apply regardless. Objects of a kind the apiserver
// does not serve yet (a custom resource whose CustomResourceDefinition is
// in a later file, or not established yet) are retried every few seconds
// for two minutes, and then at every resync.
package addons
