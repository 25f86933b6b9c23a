// Package cluster is `kelp cluster`: throwaway clusters of several kelp
// nodes on one machine, for CI and tests, without Docker. Each node is a
// machine (package machine) of its own, wired to the cluster's bridge,
// with its own cgroups below the cluster's, and inside it the default
// paths of a kelp node (/var/lib/kelp, the kubelet root, pod logs) bound
// to its directory under <root>/<name>/nodes. The host reaches the nodes
// through the cluster's forwarder (its API and published ports); the state in
// <root>/<name>/cluster.json is enough to stop, start and delete the
// cluster from any later process, also after its processes were killed.
package cluster
