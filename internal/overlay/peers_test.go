package overlay

import (
	"net"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const self = "node-a"

var cluster = netip.MustParsePrefix("10.42.0.0/16")

func config(backend string) Config {
	return Config{Backend: backend, NodeName: self, NodeIP: netip.MustParseAddr("10.99.0.2"), ClusterCIDR: cluster}
}

// node is a node that published what a kelp node of backend does.
func node(name, podCIDR, backend, ip string) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{AnnotationBackend: backend, AnnotationPublicIP: ip}},
		Spec:       corev1.NodeSpec{PodCIDR: podCIDR},
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
	vx := func(name, cidr, ip string) Peer {
		return Peer{Name: name, PodCIDR: netip.MustParsePrefix(cidr), IP: netip.MustParseAddr(ip), MAC: vtepMAC(name)}
	}
	for _, tc := range []struct {
		name    string
		backend string
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
			want:    []Peer{{Name: "node-b", PodCIDR: netip.MustParsePrefix("10.42.1.0/24"), IP: netip.MustParseAddr("10.99.0.3")}},
		},
		{
			name:    "the pod CIDR is masked",
			backend: BackendHostGW,
			nodes:   []*corev1.Node{node("node-b", "10.42.1.7/24", BackendHostGW, "10.99.0.3")},
			want:    []Peer{{Name: "node-b", PodCIDR: netip.MustParsePrefix("10.42.1.0/24"), IP: netip.MustParseAddr("10.99.0.3")}},
		},
		{
			name:    "a changed MAC is taken",
			backend: BackendVXLAN,
			nodes:   []*corev1.Node{with(node("node-b", "10.42.1.0/24", BackendVXLAN, "10.99.0.3"), AnnotationVTEPMAC, "0A:00:00:00:00:0B")},
			want: []Peer{{Name: "node-b", PodCIDR: netip.MustParsePrefix("10.42.1.0/24"), IP: netip.MustParseAddr("10.99.0.3"),
				MAC: mac("0a:00:00:00:00:0b")}},
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
				node("ipv6-ip", "10.42.6.0/24", BackendVXLAN, "fd00::7"),
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
			want: []Peer{{Name: "fine", PodCIDR: netip.MustParsePrefix("10.42.4.0/24"), IP: netip.MustParseAddr("10.99.0.7")}},
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Peers(tc.nodes, config(tc.backend)); !reflect.DeepEqual(got, tc.want) {
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
