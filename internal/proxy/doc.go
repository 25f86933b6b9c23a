// Package proxy is kelp's Service proxy (in place of kube-proxy): it
// watches Services and EndpointSlices and programs ClusterIPs and
// NodePorts as nftables verdict maps, so the cost per packet does not
// grow with the number of Services.
package proxy
