package killall

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/dns"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// The cluster DNS address goes from lo, an IPv6 one (which has no label)
// found by the node's Corefile; other addresses of lo stay.
func TestRemoveNetworkClusterDNSAddress(t *testing.T) {
	dataDir := t.TempDir()
	corefile := layout.Agent(dataDir).Corefile
	if err := os.MkdirAll(filepath.Dir(corefile), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(corefile, []byte(dns.Corefile(dns.Config{Address: netip.MustParseAddr("fd43::a"), Domain: "cluster.local"}, dns.Custom{})), 0o600); err != nil {
		t.Fatal(err)
	}
	testcluster.InNewNetns(t, func() {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			t.Fatal(err)
		}
		for _, a := range []string{"fd43::a/128", "2001:db8::1/128", "10.43.0.10/32"} {
			addr, _ := netlink.ParseAddr(a)
			addr.Flags = unix.IFA_F_NODAD
			if addr.IP.To4() != nil {
				addr.Label = dns.AddressLabel
			}
			if err := netlink.AddrAdd(lo, addr); err != nil {
				t.Fatal(err)
			}
		}
		if err := removeNetwork(dataDir); err != nil {
			t.Fatal(err)
		}
		addrs, err := netlink.AddrList(lo, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, a := range addrs {
			left = append(left, a.IPNet.String())
		}
		slices.Sort(left)
		if want := []string{"127.0.0.1/8", "2001:db8::1/128", "::1/128"}; !slices.Equal(left, want) {
			t.Errorf("addresses of lo %v, want %v", left, want)
		}
	})
}
