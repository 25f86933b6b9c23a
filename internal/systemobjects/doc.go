// Package systemobjects holds the API objects kelp itself needs before any
// node joins (access to the join API, the nodes' controllers' grant, and
// the admission policies and the volumes webhook's configuration that keep
// each node's controllers to their own node's objects), applied on every
// start, and the checks that keep the built-in manifests
// (internal/addons) applicable to an existing cluster.
//
// The server applies them with server-side apply under the field manager
// "kelp", forcing ownership of the fields it sets, so that a rule a newer
// kelp adds reaches a cluster an older one made, and an edit to those
// fields is undone at the next start. Fields kelp does not set (a label a
// user adds) are left alone.
package systemobjects
