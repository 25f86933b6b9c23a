package overlay

import (
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const self = "node-a"

func config(backend string) Config {
	return configOf(backend, "10.99.0.2", "10.42.0.0/16")
}

// configOf is the config of this node with the node IPs and cluster CIDRs
// in the comma-separated lists ips and cidrs.
func configOf(backend, ips, cidrs string) Config {
	cfg := Config{Backend: backend, NodeName: self}
	for _, ip := range strings.Split(ips, ",") {
		cfg.NodeIPs = append(cfg.NodeIPs, netip.MustParseAddr(ip))
	}
	cfg.ClusterCIDRs = prefixes(cidrs)
	return cfg
}

func prefixes(list string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func addrs(list string) []netip.Addr {
	var out []netip.Addr
	for _, s := range strings.Split(list, ",") {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// node is a node that published what a kelp node of backend does, with
// the pod CIDRs and node IPs in the comma-separated lists podCIDRs and
// ips. A node of one pod CIDR has it only in spec.podCIDR, as fixtures of
// older Kubernetes do.
func node(name, podCIDRs, backend, ips string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{AnnotationBackend: backend}}}
	if cidrs := strings.Split(podCIDRs, ","); len(cidrs) > 1 {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = cidrs[0], cidrs
	} else {
		n.Spec.PodCIDR = podCIDRs
	}
	for _, ip := range strings.Split(ips, ",") {
		key := AnnotationPublicIP
		if strings.Contains(ip, ":") {
			key = AnnotationPublicIPv6
		}
		n.Annotations[key] = ip
	}
	if backend == BackendVXLAN {
		n.Annotations[AnnotationVTEPMAC] = vtepMAC(name).String()
	}
	return n
}

func with(n *corev1.Node, key, value string) *corev1.Node {
	n.Annotations[key] = value
	return n
}

func without(n *corev1.Node, key string) *corev1.Node {
	delete(n.Annotations, key)
	return n
}

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func TestPeers(t *testing.T) {
	vx := func(name, cidrs, ips string) Peer {
		return Peer{Name: name, PodCIDRs: prefixes(cidrs), IPs: addrs(ips), MAC: vtepMAC(name)}
	}
	gw := func(name, cidrs, ips string) Peer {
		return Peer{Name: name, PodCIDRs: prefixes(cidrs), IPs: addrs(ips)}
	}
	const (
		dual    = "10.42.0.0/16,fd42::/56"
		dual6   = "fd42::/56,10.42.0.0/16"
		only6   = "fd42::/56"
		nodeIPs = "10.99.0.2,fd99::2"
	)
	for _, tc := range []struct {
		name    string
		backend string
		cfg     Config // config(backend) if zero
		nodes   []*corev1.Node
		want    []Peer
	}{
		{
			name:    "vxlan peers by name, self skipped",
			backend: BackendVXLAN,
			nodes: []*corev1.Node{
				node("node-c", "10.42.2.0/24", BackendVXLAN, "10.99.0.4"),
				node(self, "10.42.0.0/24", BackendVXLAN, "10.99.0.2"),
				node("node-b", "10.42.1.0/24", BackendVXLAN, "10.99.0.3"),
			},
			want: []Peer{vx("node-b", "10.42.1.0/24", "10.99.0.3"), vx("node-c", "10.42.2.0/24", "10.99.0.4")},
		},
		{
			name:    "host-gw needs no MAC",
			backend: BackendHostGW,
			nodes:   []*corev1.Node{node("node-b", "10.42.1.0/24", BackendHostGW, "10.99.0.3")},
			want:    []Peer{gw("node-b", "10.42.1.0/24", "10.99.0.3")},
		},
		{
			name:    "the pod CIDR is masked",
			backend: BackendHostGW,
			nodes:   []*corev1.Node{node("node-b", "10.42.1.7/24", BackendHostGW, "10.99.0.3")},
			want:    []Peer{gw("node-b", "10.42.1.0/24", "10.99.0.3")},
		},
		{
			name:    "a changed MAC is taken",
			backend: BackendVXLAN,
			nodes:   []*corev1.Node{with(node("node-b", "10.42.1.0/24", BackendVXLAN, "10.99.0.3"), AnnotationVTEPMAC, "0A:00:00:00:00:0B")},
			want:    []Peer{{Name: "node-b", PodCIDRs: prefixes("10.42.1.0/24"), IPs: addrs("10.99.0.3"), MAC: mac("0a:00:00:00:00:0b")}},
		},
		{
			name:    "skipped: no pod CIDR, or a bad one",
			backend: BackendVXLAN,
			nodes: []*corev1.Node{
				node("no-cidr", "", BackendVXLAN, "10.99.0.3"),
				node("bad-cidr", "10.42.1.0", BackendVXLAN, "10.99.0.4"),
				node("outside", "10.43.1.0/24", BackendVXLAN, "10.99.0.5"),
				node("larger", "10.42.0.0/15", BackendVXLAN, "10.99.0.6"),
				node("ipv6", "fd00:42::/64", BackendVXLAN, "10.99.0.7"),
			},
		},
		{
			name:    "skipped: annotations missing, invalid or of another backend",
			backend: BackendVXLAN,
			nodes: []*corev1.Node{
				{ObjectMeta: metav1.ObjectMeta{Name: "bare"}, Spec: corev1.NodeSpec{PodCIDR: "10.42.1.0/24"}},
				without(node("no-backend", "10.42.2.0/24", BackendVXLAN, "10.99.0.4"), AnnotationBackend),
				node("host-gw", "10.42.3.0/24", BackendHostGW, "10.99.0.5"),
				node("no-ip", "10.42.4.0/24", BackendVXLAN, ""),
				node("bad-ip", "10.42.5.0/24", BackendVXLAN, "10.99.0"),
				with(node("ipv6-ip", "10.42.6.0/24", BackendVXLAN, "10.99.0.7"), AnnotationPublicIP, "fd00::7"),
				with(node("ipv4-ipv6", "10.42.10.0/24", BackendVXLAN, "10.99.0.11"), AnnotationPublicIPv6, "10.99.0.12"),
				with(node("mapped-ip", "10.42.11.0/24", BackendVXLAN, "10.99.0.12"), AnnotationPublicIP, "::ffff:10.99.0.12"),
				without(node("no-mac", "10.42.7.0/24", BackendVXLAN, "10.99.0.8"), AnnotationVTEPMAC),
				with(node("bad-mac", "10.42.8.0/24", BackendVXLAN, "10.99.0.9"), AnnotationVTEPMAC, "0a:00:00"),
				with(node("multicast-mac", "10.42.9.0/24", BackendVXLAN, "10.99.0.10"), AnnotationVTEPMAC, "01:00:5e:00:00:01"),
			},
		},
		{
			name:    "skipped: a vxlan node of a host-gw cluster",
			backend: BackendHostGW,
			nodes:   []*corev1.Node{node("node-b", "10.42.1.0/24", BackendVXLAN, "10.99.0.3")},
		},
		{
			name:    "skipped: pod CIDRs that overlap this node's or each other's",
			backend: BackendHostGW,
			nodes: []*corev1.Node{
				node(self, "10.42.0.0/24", BackendHostGW, "10.99.0.2"),
				node("same-as-self", "10.42.0.0/24", BackendHostGW, "10.99.0.3"),
				node("in-self", "10.42.0.128/25", BackendHostGW, "10.99.0.4"),
				node("b", "10.42.2.0/23", BackendHostGW, "10.99.0.5"),
				node("in-b", "10.42.3.0/24", BackendHostGW, "10.99.0.6"),
				node("fine", "10.42.4.0/24", BackendHostGW, "10.99.0.7"),
			},
			want: []Peer{gw("fine", "10.42.4.0/24", "10.99.0.7")},
		},
		{
			name:    "skipped: VTEP MACs that are this node's or another's",
			backend: BackendVXLAN,
			nodes: []*corev1.Node{
				with(node("copy-of-self", "10.42.1.0/24", BackendVXLAN, "10.99.0.3"), AnnotationVTEPMAC, vtepMAC(self).String()),
				with(node("b", "10.42.2.0/24", BackendVXLAN, "10.99.0.4"), AnnotationVTEPMAC, "0a:00:00:00:00:0b"),
				with(node("copy-of-b", "10.42.3.0/24", BackendVXLAN, "10.99.0.5"), AnnotationVTEPMAC, "0a:00:00:00:00:0b"),
				node("fine", "10.42.4.0/24", BackendVXLAN, "10.99.0.6"),
			},
			want: []Peer{vx("fine", "10.42.4.0/24", "10.99.0.6")},
		},
		{
			name:    "dual-stack: both pod CIDRs and node IPs, in the cluster's order",
			backend: BackendVXLAN,
			cfg:     configOf(BackendVXLAN, nodeIPs, dual),
			nodes: []*corev1.Node{
				node(self, "10.42.0.0/24,fd42::/64", BackendVXLAN, nodeIPs),
				node("node-b", "10.42.1.0/24,fd42:0:0:1::/64", BackendVXLAN, "10.99.0.3,fd99::3"),
				node("v6-first", "fd42:0:0:2::/64,10.42.2.0/24", BackendVXLAN, "fd99::4,10.99.0.4"),
			},
			want: []Peer{
				vx("node-b", "10.42.1.0/24,fd42:0:0:1::/64", "10.99.0.3,fd99::3"),
				vx("v6-first", "10.42.2.0/24,fd42:0:0:2::/64", "10.99.0.4,fd99::4"),
			},
		},
		{
			name:    "dual-stack, IPv6 first",
			backend: BackendHostGW,
			cfg:     configOf(BackendHostGW, "fd99::2,10.99.0.2", dual6),
			nodes:   []*corev1.Node{node("node-b", "10.42.1.0/24,fd42:0:0:1::/64", BackendHostGW, "10.99.0.3,fd99::3")},
			want:    []Peer{gw("node-b", "fd42:0:0:1::/64,10.42.1.0/24", "10.99.0.3,fd99::3")},
		},
		{
			name:    "dual-stack: a node of before the cluster had IPv6 is routed over IPv4",
			backend: BackendVXLAN,
			cfg:     configOf(BackendVXLAN, nodeIPs, dual),
			nodes:   []*corev1.Node{node("old", "10.42.1.0/24", BackendVXLAN, "10.99.0.3")},
			want:    []Peer{vx("old", "10.42.1.0/24", "10.99.0.3")},
		},
		{
			name:    "IPv4 only: the IPv6 pod CIDR of a family the cluster dropped is left out",
			backend: BackendVXLAN,
			nodes:   []*corev1.Node{node("node-b", "10.42.1.0/24,fd42:0:0:1::/64", BackendVXLAN, "10.99.0.3,fd99::3")},
			want:    []Peer{vx("node-b", "10.42.1.0/24", "10.99.0.3,fd99::3")},
		},
		{
			name:    "IPv6 only, over IPv6",
			backend: BackendVXLAN,
			cfg:     configOf(BackendVXLAN, "fd99::2", only6),
			nodes: []*corev1.Node{
				node("node-b", "fd42:0:0:1::/64", BackendVXLAN, "fd99::3"),
				node("v4-only", "fd42:0:0:2::/64", BackendVXLAN, "10.99.0.4"),
			},
			want: []Peer{vx("node-b", "fd42:0:0:1::/64", "fd99::3")},
		},
		{
			name:    "IPv6 only, over IPv4 where no node has an IPv6 node IP",
			backend: BackendVXLAN,
			cfg:     configOf(BackendVXLAN, "10.99.0.2", only6),
			nodes: []*corev1.Node{
				node("node-b", "fd42:0:0:1::/64", BackendVXLAN, "10.99.0.3"),
				node("over-v6", "fd42:0:0:2::/64", BackendVXLAN, "fd99::4,10.99.0.4"),
			},
			want: []Peer{vx("node-b", "fd42:0:0:1::/64", "10.99.0.3")},
		},
		{
			name:    "dual-stack, skipped: bad pod CIDRs or node IPs",
			backend: BackendHostGW,
			cfg:     configOf(BackendHostGW, nodeIPs, dual),
			nodes: []*corev1.Node{
				node("v6-outside", "10.42.1.0/24,fd43::/64", BackendHostGW, "10.99.0.3,fd99::3"),
				node("v6-larger", "10.42.2.0/24,fd42::/48", BackendHostGW, "10.99.0.4,fd99::4"),
				node("two-v4", "10.42.3.0/24,10.42.4.0/24", BackendHostGW, "10.99.0.5,fd99::5"),
				node("no-v6-ip", "10.42.5.0/24,fd42:0:0:5::/64", BackendHostGW, "10.99.0.6"),
				node("no-v4-ip", "10.42.6.0/24,fd42:0:0:6::/64", BackendHostGW, "fd99::7"),
				node("v6-overlaps-self", "10.42.7.0/24,fd42::/64", BackendHostGW, "10.99.0.8,fd99::8"),
				node(self, "10.42.0.0/24,fd42::/64", BackendHostGW, nodeIPs),
				node("fine", "10.42.8.0/24,fd42:0:0:8::/64", BackendHostGW, "10.99.0.9,fd99::9"),
			},
			want: []Peer{gw("fine", "10.42.8.0/24,fd42:0:0:8::/64", "10.99.0.9,fd99::9")},
		},
		{
			name:    "dual-stack vxlan over IPv4, skipped: a node of no IPv4 node IP",
			backend: BackendVXLAN,
			cfg:     configOf(BackendVXLAN, nodeIPs, dual),
			nodes: []*corev1.Node{
				node("v6-only", "10.42.1.0/24,fd42:0:0:1::/64", BackendVXLAN, "fd99::3"),
				node("fine", "10.42.2.0/24,fd42:0:0:2::/64", BackendVXLAN, "10.99.0.4"),
			},
			want: []Peer{vx("fine", "10.42.2.0/24,fd42:0:0:2::/64", "10.99.0.4")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.Backend == "" {
				cfg = config(tc.backend)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := Peers(tc.nodes, cfg); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Peers =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// The VTEP MAC is the same for a node every time, differs between nodes
// and is a unicast address no vendor owns.
func TestVTEPMAC(t *testing.T) {
	a, b := vtepMAC("node-a"), vtepMAC("node-b")
	if a.String() != vtepMAC("node-a").String() {
		t.Errorf("vtepMAC(node-a) = %s, then %s", a, vtepMAC("node-a"))
	}
	if a.String() == b.String() {
		t.Errorf("node-a and node-b share %s", a)
	}
	for _, m := range []net.HardwareAddr{a, b} {
		if len(m) != 6 || m[0]&1 != 0 || m[0]&2 == 0 {
			t.Errorf("%s is not a locally administered unicast address", m)
		}
	}
}
