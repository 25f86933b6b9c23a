// Package proxy is kelp's Service proxy (in place of kube-proxy): it
// watches Services and EndpointSlices and programs ClusterIPs and
// NodePorts as nftables verdict maps, so the cost per packet does not
// grow with the number of Services.
//
// After a burst of changes only the changed Services' chains and map
// entries are rewritten, in one atomic netlink batch; the whole table is
// written at start and when a resync (every 10 s) finds that someone else
// changed it. Like kube-proxy's nftables mode, a dual-stack node has one
// table per family (ip and ip6 kelp-proxy); an IPv4-only node registers no
// IPv6 NAT hooks. Pods' hostPorts are served here too, as the CNI portmap
// plugin would serve them with iptables. When a UDP endpoint goes, its
// conntrack entries are deleted over netlink, so clients that keep their
// source port reach the new endpoint at once.
package proxy
