package config

import "net/netip"

// Agent is the validated configuration of a node: the one `kelp server`
// runs beside its control plane.
type Agent struct {
	DataDir         string
	NodeName        string
	NodeIPs         []netip.Addr
	NodeLabels      []string
	NodeTaints      []string
	PrivateRegistry string
	ClusterCIDR     netip.Prefix
	ClusterDNS      netip.Addr
	ClusterDomain   string
	KubeletArgs     []string
	DisableDNS      bool
	// DisableNetworkPolicy leaves NetworkPolicies to another controller.
	DisableNetworkPolicy bool
	Debug                bool
}

// Agent is the configuration of the server's own node.
func (s Server) Agent() Agent {
	return Agent{
		DataDir:              s.DataDir,
		NodeName:             s.NodeName,
		NodeIPs:              s.NodeIPs,
		NodeLabels:           s.NodeLabels,
		NodeTaints:           s.NodeTaints,
		PrivateRegistry:      s.PrivateRegistry,
		ClusterCIDR:          s.ClusterCIDR,
		ClusterDNS:           s.ClusterDNS,
		ClusterDomain:        s.ClusterDomain,
		KubeletArgs:          s.ExtraArgs.Kubelet,
		DisableDNS:           s.Disable.CoreDNS,
		DisableNetworkPolicy: s.Disable.NetworkPolicy,
		Debug:                s.Debug,
	}
}
