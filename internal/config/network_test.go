package config

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kelp-dev/kelp/internal/kubeargs"
)

func TestDualStack(t *testing.T) {
	tests := []struct {
		name                  string
		args                  []string
		cluster, service, dns string
		firstService, nodeIPs string
	}{
		{"default IPv4", nil, "10.42.0.0/16", "10.43.0.0/16", "10.43.0.10", "10.43.0.1", "192.168.1.10"},
		{"dual, IPv4 primary",
			[]string{"--cluster-cidr", "10.42.0.0/16,fd42::/56", "--service-cidr", "10.43.0.0/16, fd43::/112", "--node-ip", "192.168.1.10,2001:db8::10"},
			"10.42.0.0/16,fd42::/56", "10.43.0.0/16,fd43::/112", "10.43.0.10", "10.43.0.1,fd43::1", "192.168.1.10,2001:db8::10"},
		{"dual, IPv6 primary",
			[]string{"--cluster-cidr", "fd42::/56,10.42.0.0/16", "--service-cidr", "fd43::/112,10.43.0.0/16", "--node-ip", "2001:db8::10,192.168.1.10"},
			"fd42::/56,10.42.0.0/16", "fd43::/112,10.43.0.0/16", "fd43::a", "fd43::1,10.43.0.1", "2001:db8::10,192.168.1.10"},
		{"dual, IPv6 primary, node IPs IPv4 first",
			[]string{"--cluster-cidr", "fd42::/56,10.42.0.0/16", "--service-cidr", "fd43::/112,10.43.0.0/16", "--node-ip", "192.168.1.10,2001:db8::10"},
			"fd42::/56,10.42.0.0/16", "fd43::/112,10.43.0.0/16", "fd43::a", "fd43::1,10.43.0.1", "192.168.1.10,2001:db8::10"},
		{"IPv6 only",
			[]string{"--cluster-cidr", "fd42::/48", "--service-cidr", "fd43::/108", "--node-ip", "2001:db8::10"},
			"fd42::/48", "fd43::/108", "fd43::a", "fd43::1", "2001:db8::10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := runServer(t, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			var ips, first []string
			for _, ip := range s.NodeIPs {
				ips = append(ips, ip.String())
			}
			for _, ip := range s.FirstServiceIPs() {
				first = append(first, ip.String())
			}
			got := []string{kubeargs.CIDRs(s.ClusterCIDRs), kubeargs.CIDRs(s.ServiceCIDRs), s.ClusterDNS.String(), strings.Join(first, ","), strings.Join(ips, ",")}
			want := []string{tt.cluster, tt.service, tt.dns, tt.firstService, tt.nodeIPs}
			if !slices.Equal(got, want) {
				t.Errorf("cluster, service, dns, first service IPs, node IPs = %q, want %q", got, want)
			}
			if s.AdvertiseAddress.Is6() != s.ServiceCIDRs[0].Addr().Is6() {
				t.Errorf("advertise address %s, not of the primary family of %v", s.AdvertiseAddress, s.ServiceCIDRs)
			}
			if s.FirstServiceIP() != s.FirstServiceIPs()[0] || !slices.Equal(s.Agent().ClusterCIDRs, s.ClusterCIDRs) {
				t.Errorf("primary service IP %s, agent's cluster CIDRs %v", s.FirstServiceIP(), s.Agent().ClusterCIDRs)
			}
		})
	}
}

// TestDualStackBadInput is every bad input of the cluster's ranges and the
// node IPs: each error names what to change.
func TestDualStackBadInput(t *testing.T) {
	dual := []string{"--node-ip", "192.168.1.10,2001:db8::10"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"three cluster CIDRs", []string{"--cluster-cidr", "10.42.0.0/16,fd42::/56,fd44::/56"}, "want one CIDR, or two"},
		{"two IPv4 cluster CIDRs", []string{"--cluster-cidr", "10.42.0.0/16,10.44.0.0/16"}, "two CIDRs of one family"},
		{"two IPv6 service CIDRs", []string{"--service-cidr", "fd43::/112,fd44::/112"}, "two CIDRs of one family"},
		{"empty item", []string{"--cluster-cidr", "10.42.0.0/16,"}, "not a CIDR"},
		{"IPv6 host bits", []string{"--cluster-cidr", "10.42.0.0/16,fd42::1/56", "--service-cidr", "10.43.0.0/16,fd43::/112"}, "did you mean fd42::/56"},
		{"v6 overlap", append([]string{"--cluster-cidr", "10.42.0.0/16,fd42::/56", "--service-cidr", "10.43.0.0/16,fd42::/112"}, dual...), "--cluster-cidr fd42::/56 overlaps --service-cidr fd42::/112"},
		{"families differ", append([]string{"--cluster-cidr", "10.42.0.0/16,fd42::/56"}, dual...), "give both the same families"},
		{"primaries differ", append([]string{"--cluster-cidr", "10.42.0.0/16,fd42::/56", "--service-cidr", "fd43::/112,10.43.0.0/16"}, dual...), "give both the same families"},
		{"IPv6 service range too large", append([]string{"--cluster-cidr", "10.42.0.0/16,fd42::/56", "--service-cidr", "10.43.0.0/16,fd43::/64"}, dual...), "use a /108 or smaller range, such as fd43::/108"},
		{"IPv6 cluster CIDR smaller than a node's", append([]string{"--cluster-cidr", "10.42.0.0/16,fd42::/72", "--service-cidr", "10.43.0.0/16,fd43::/112"}, dual...), "smaller than one node's pod range (a /64"},
		{"IPv4 cluster CIDR smaller than a node's", []string{"--cluster-cidr", "10.42.0.0/25"}, "node-cidr-mask-size-ipv4=N with N of 25 or more"},
		{"IPv6 cluster CIDR too large", append([]string{"--cluster-cidr", "10.42.0.0/16,fd42::/40", "--service-cidr", "10.43.0.0/16,fd43::/112"}, dual...), "use a /48 or smaller range (a /56 gives 256 nodes)"},
		{"one node mask for two families", append([]string{"--cluster-cidr", "10.42.0.0/16,fd42::/56", "--service-cidr", "10.43.0.0/16,fd43::/112", "--kube-controller-manager-arg", "node-cidr-mask-size=24"}, dual...), "set node-cidr-mask-size-ipv4 and node-cidr-mask-size-ipv6 instead"},
		{"advertise address of the other family", append([]string{"--cluster-cidr", "10.42.0.0/16,fd42::/56", "--service-cidr", "10.43.0.0/16,fd43::/112", "--advertise-address", "2001:db8::10"}, dual...), "--advertise-address 2001:db8::10: want an address of the primary Service range's family, as 10.43.0.0/16"},
		{"no node IP of the primary family to advertise", []string{"--disable-agent", "--cluster-cidr", "fd42::/56", "--service-cidr", "fd43::/112"}, "no node IP of the primary Service range's family (fd43::/112)"},
		{"bad node mask arg", []string{"--kube-controller-manager-arg", "node-cidr-mask-size-ipv4=x"}, "want a prefix length"},
		{"two IPv4 node IPs", []string{"--node-ip", "192.168.1.10,192.168.1.11"}, "at most one address of each family"},
		{"three node IPs", []string{"--node-ip", "192.168.1.10,2001:db8::10,2001:db8::11"}, "at most one address of each family"},
		{"dual-stack node without an IPv6 node IP", []string{"--cluster-cidr", "10.42.0.0/16,fd42::/56", "--service-cidr", "10.43.0.0/16,fd43::/112"}, "no IPv6 node IP (it has 192.168.1.10)"},
		{"IPv6-only node without an IPv6 node IP", []string{"--cluster-cidr", "fd42::/56", "--service-cidr", "fd43::/112"}, "no IPv6 node IP"},
		{"dual-stack node without an IPv4 node IP", []string{"--cluster-cidr", "10.42.0.0/16,fd42::/56", "--service-cidr", "10.43.0.0/16,fd43::/112", "--node-ip", "2001:db8::10"}, "giving an IPv4 address of the node too"},
		{"cluster DNS outside the primary range", append([]string{"--cluster-cidr", "10.42.0.0/16,fd42::/56", "--service-cidr", "10.43.0.0/16,fd43::/112", "--cluster-dns", "fd43::a"}, dual...), "outside --service-cidr 10.43.0.0/16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := runServer(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
	// A controller-manager told to hand out /26s takes a /25.
	if _, err := runServer(t, "--cluster-cidr", "10.42.0.0/25", "--kube-controller-manager-arg", "node-cidr-mask-size-ipv4=26"); err != nil {
		t.Errorf("a /25 with /26 node ranges: %v", err)
	}
	// A node of a dual-stack cluster may run without the agent.
	if _, err := runServer(t, "--disable-agent", "--cluster-cidr", "10.42.0.0/16,fd42::/56", "--service-cidr", "10.43.0.0/16,fd43::/112"); err != nil {
		t.Errorf("a dual-stack server without a node: %v", err)
	}
}

// TestCheckNode is the check a node makes of the cluster it joins, on
// machines of several kinds.
func TestCheckNode(t *testing.T) {
	cluster := []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16"), netip.MustParsePrefix("fd42::/56")}
	service := []netip.Prefix{netip.MustParsePrefix("10.43.0.0/16"), netip.MustParsePrefix("fd43::/112")}
	v4 := Node{NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.1.10")}}
	dual := Node{NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd42::10")}}
	lan := netip.MustParsePrefix("192.168.1.10/24")
	tests := []struct {
		name string
		node Node
		host Host
		want string // "": no error
	}{
		{"dual node", Node{NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("2001:db8::10")}},
			Host{Networks: []netip.Prefix{lan, netip.MustParsePrefix("2001:db8::10/64")}}, ""},
		{"IPv6 disabled", v4, Host{Networks: []netip.Prefix{lan}, IPv6Disabled: true}, "IPv6 is disabled on this machine (net.ipv6.conf.all.disable_ipv6=1): enable it"},
		{"no global IPv6 address", v4, Host{Networks: []netip.Prefix{lan, netip.MustParsePrefix("fe80::1/64")}}, "this machine has no global IPv6 address"},
		{"an IPv6 address not given", v4, Host{Networks: []netip.Prefix{lan, netip.MustParsePrefix("2001:db8::10/64")}}, "such as --node-ip 192.168.1.10,2001:db8::10"},
		{"IPv6 range on the node's network", dual, Host{Networks: []netip.Prefix{lan, netip.MustParsePrefix("fd42::10/64")}}, "the cluster's range fd42::/56 overlaps this node's network fd42::/64 (node IP fd42::10)"},
		{"IPv4 range on the node's network only warns", Node{NodeIPs: []netip.Addr{netip.MustParseAddr("10.42.200.5"), netip.MustParseAddr("2001:db8::10")}},
			Host{Networks: []netip.Prefix{netip.MustParsePrefix("10.42.200.5/24"), netip.MustParsePrefix("2001:db8::10/64")}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckNode(tt.node, tt.host, cluster, service)
			if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("got %v, want %q", err, tt.want)
			}
		})
	}
}
