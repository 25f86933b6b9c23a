package overlay

import (
	"net/netip"
	"reflect"
	"testing"
)

func TestSources(t *testing.T) {
	for _, tc := range []struct {
		name  string
		peers []Peer
		want  map[family][]netip.Addr
	}{
		{name: "no peers", want: map[family][]netip.Addr{}},
		{
			name:  "IPv4",
			peers: []Peer{peerOf("node-c", "10.42.2.0/24", "10.99.0.4", nil), peerOf("node-b", "10.42.1.0/24", "10.99.0.3", nil)},
			want:  map[family][]netip.Addr{ipv4: addrs("10.99.0.3,10.99.0.4")},
		},
		{
			// Both families of each peer, whichever VXLAN runs over.
			name: "dual-stack",
			peers: []Peer{
				peerOf("node-b", "fd42:0:0:1::/64", "10.99.0.3,fd99::3", nil),
				peerOf("node-c", "fd42:0:0:2::/64", "fd99::4", nil),
			},
			want: map[family][]netip.Addr{ipv4: addrs("10.99.0.3"), ipv6: addrs("fd99::3,fd99::4")},
		},
		{
			// Peers cannot share a pod CIDR, but can a node IP.
			name:  "a node IP of two peers",
			peers: []Peer{peerOf("node-b", "10.42.1.0/24", "10.99.0.3", nil), peerOf("node-c", "10.42.2.0/24", "10.99.0.3", nil)},
			want:  map[family][]netip.Addr{ipv4: addrs("10.99.0.3")},
		},
	} {
		if got := sources(tc.peers); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: sources = %v, want %v", tc.name, got, tc.want)
		}
	}
}
