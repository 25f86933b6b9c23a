// Package cni sets up a node's pod network: the CNI configuration for the
// bundled bridge and host-local plugins, written once the node has a pod
// CIDR, and pod egress masquerade in kelp's own nftables table.
package cni
