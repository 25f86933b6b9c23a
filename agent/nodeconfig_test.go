package agent

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/joinapi"
)

// TestNodeConfig: a node takes the cluster's ranges from the join's comma
// lists, and refuses to start in a dual-stack cluster it cannot serve.
func TestNodeConfig(t *testing.T) {
	dual := joinapi.AgentConfig{ClusterCIDR: "10.42.0.0/16,fd42::/56", ServiceCIDR: "10.43.0.0/16,fd43::/112", ClusterDNS: "10.43.0.10"}
	host := config.Host{Networks: []netip.Prefix{netip.MustParsePrefix("10.99.0.3/24"), netip.MustParsePrefix("fd99::3/64")}}
	node := config.Node{NodeIPs: []netip.Addr{netip.MustParseAddr("10.99.0.3"), netip.MustParseAddr("fd99::3")}}
	a, err := nodeConfig(node, host, dual)
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16"), netip.MustParsePrefix("fd42::/56")}; !slices.Equal(a.ClusterCIDRs, want) {
		t.Errorf("cluster CIDRs %v, want %v", a.ClusterCIDRs, want)
	}
	v4 := config.Node{NodeIPs: node.NodeIPs[:1]}
	if _, err := nodeConfig(v4, config.Host{IPv6Disabled: true}, dual); err == nil || !strings.Contains(err.Error(), "this node cannot join the cluster: the cluster has the IPv6 pod range fd42::/56 but this node has no IPv6 node IP") {
		t.Errorf("an IPv4 node in a dual-stack cluster: %v", err)
	}
	// A server of an early kelp sent no service CIDR.
	old := joinapi.AgentConfig{ClusterCIDR: "10.42.0.0/16", ClusterDNS: "10.43.0.10"}
	if a, err := nodeConfig(v4, host, old); err != nil || len(a.ClusterCIDRs) != 1 {
		t.Errorf("an IPv4 cluster of an early server: %v %v", a.ClusterCIDRs, err)
	}
	bad := dual
	bad.ClusterCIDR = "10.42.0.0/16,10.44.0.0/16"
	if _, err := nodeConfig(node, host, bad); err == nil || !strings.Contains(err.Error(), "the server's cluster CIDR") {
		t.Errorf("two IPv4 ranges from the server: %v", err)
	}
}
