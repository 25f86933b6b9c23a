// Package machine makes machines inside this one: network, mount, cgroup
// and UTS namespaces of their own, held open by a sleeping process, each
// with its own cgroup subtree that it sees as the cgroup root, private
// copies of the host paths a kelp node keeps state in, and a Network
// whose bridge links them. A kelp node runs in a machine as on a host of
// its own, and touches nothing of the host's or another machine's.
//
// The cluster tests (internal/testcluster), the benchmarks (scripts/) and
// `kelp cluster` make their nodes with it.
package machine
