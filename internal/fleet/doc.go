// Package fleet upgrades the kelp of a cluster's nodes from inside the
// cluster. An admin creates an Upgrade (kelp.io/v1, cluster-scoped) naming
// the new binary by sha256 and where every node finds it. A controller on
// the servers (one at a time, by a Lease) upgrades the servers one by one,
// then the agents a few at a time: it cordons and drains a node, asks it
// to upgrade by an annotation on its Node, waits for the node to report
// the new kelp, and uncordons it. The executor in every node fetches and
// checks the binary, puts it in place of the running one keeping
// kelp.previous (which the boot guard rolls back to), and restarts kelp.
// A node reports what became of its upgrade on its Node at its next start:
// the new kelp, or the old one with the boot guard's reason.
package fleet
