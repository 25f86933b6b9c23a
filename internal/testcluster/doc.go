// Package testcluster runs real kelp processes for cluster tests, each node
// in network and mount namespaces of its own, so tests never touch the
// machine's interfaces, routes, nftables or mounts, and leave nothing
// behind: the namespaces die with the processes the tests kill.
//
// NewNode makes a single machine. A Lab links several nodes (a server and
// agents) by a bridge in a namespace of its own. Every node has its own
// cgroup subtree as well, which it sees as the cgroup root, so the kubelets
// of nodes running at once, in one test or in tests run in parallel, do not
// share kubepods.
//
// Cluster tests need root and a built kelp binary ($KELP_BIN, default
// bin/kelp at the top of the repository; scripts/test.sh builds it).
package testcluster
