package killall

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

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
		lo := testcluster.Loopback(t)
		// The IPv4 one labelled as kelp labels it.
		v4, _ := netlink.ParseAddr("10.43.0.10/32")
		v4.Label = dns.AddressLabel
		if err := netlink.AddrAdd(lo, v4); err != nil {
			t.Fatal(err)
		}
		if err := testcluster.AddAddrs(lo, "fd43::a/128", "2001:db8::1/128"); err != nil {
			t.Fatal(err)
		}
		if err := removeNetwork(dataDir); err != nil {
			t.Fatal(err)
		}
		left, err := testcluster.AddrsOf(lo)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"127.0.0.1/8", "2001:db8::1/128", "::1/128"}; !slices.Equal(left, want) {
			t.Errorf("addresses of lo %v, want %v", left, want)
		}
	})
}

// The Gateway addresses the node recorded go from their interface, and the
// record with them; an address it did not record stays.
func TestRemoveGatewayAddresses(t *testing.T) {
	dataDir := t.TempDir()
	record := layout.Agent(dataDir).GatewayAddresses
	if err := os.MkdirAll(filepath.Dir(record), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, []byte(`{"addresses":[{"address":"10.8.0.100","interface":"veth0"},{"address":"fd08::100","interface":"veth0"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	testcluster.InNewNetns(t, func() {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0"}, PeerName: "veth1"}); err != nil {
			t.Fatal(err)
		}
		link, err := netlink.LinkByName("veth0")
		if err != nil {
			t.Fatal(err)
		}
		if err := testcluster.AddAddrs(link, "10.8.0.1/24", "10.8.0.100/32", "10.8.0.101/32", "fd08::100/128", "fd08::101/128"); err != nil {
			t.Fatal(err)
		}
		if err := removeGatewayAddresses(dataDir); err != nil {
			t.Fatal(err)
		}
		left, err := testcluster.AddrsOf(link)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"10.8.0.1/24", "10.8.0.101/32", "fd08::101/128"}; !slices.Equal(left, want) {
			t.Errorf("addresses of veth0 %v, want %v", left, want)
		}
	})
	if _, err := os.Stat(record); !os.IsNotExist(err) {
		t.Errorf("the record is still there: %v", err)
	}
}
