// Package overlay connects the pod networks of a cluster's nodes, in place
// of flannel. Pods on one node already reach each other over the CNI
// bridge; this package makes the pod CIDRs of all other nodes reachable.
// Each node publishes on its Node object how it is reached (annotations
// overlay.kelp.io/*), and routes every other node's pod CIDRs, IPv4 and
// IPv6, either through a VXLAN device (backend vxlan, which works across
// routed networks and carries both families over one of them) or straight
// to the other node's IP of the same family (backend host-gw, for nodes on
// one L2 segment, without encapsulation overhead).
//
// VXLAN is neither authenticated nor encrypted: with backend vxlan a node
// lets VXLAN packets in from its peers' node IPs only (Table).
//
// What it programs stays in place when kelp stops, so pods keep talking
// while kelp restarts; `kelp killall` removes it with Remove.
package overlay
