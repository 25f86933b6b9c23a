package proxy

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

func TestApplyProgramsTheKernel(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		ports := []Port{
			{ClusterIP: netip.MustParseAddr("10.43.0.1"), Protocol: unix.IPPROTO_TCP, Port: 443,
				Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.2:6443")}},
			{ClusterIP: netip.MustParseAddr("10.43.0.20"), Protocol: unix.IPPROTO_UDP, Port: 53, NodePort: 30053,
				ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.7")},
				Endpoints:   []netip.AddrPort{netip.MustParseAddrPort("10.42.0.5:5353"), netip.MustParseAddrPort("10.42.0.6:5353")}},
			{ClusterIP: netip.MustParseAddr("10.43.0.30"), Protocol: unix.IPPROTO_TCP, Port: 80},
			// A hostPort, and one that collides with a NodePort: the Service wins.
			{Protocol: unix.IPPROTO_TCP, NodePort: 8443, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.42.0.7:443")}},
			{Protocol: unix.IPPROTO_UDP, NodePort: 30053, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.42.0.8:53")}},
			// externalTrafficPolicy Local and client IP affinity.
			{ClusterIP: netip.MustParseAddr("10.43.0.40"), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: 30040,
				Endpoints:     []netip.AddrPort{netip.MustParseAddrPort("10.42.0.5:80"), netip.MustParseAddrPort("10.42.1.5:80")},
				ExternalLocal: true, LocalEndpoints: []netip.AddrPort{netip.MustParseAddrPort("10.42.0.5:80")},
				Affinity: time.Minute},
		}
		cidr := netip.MustParsePrefix("10.42.0.0/16")
		if err := Apply(c, cidr, ports); err != nil {
			t.Fatal(err)
		}
		// A client that stuck to an endpoint still does after the table
		// is replaced.
		sticky := &nftables.Set{Table: &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4}, Name: "affinity-10.43.0.40-6-80-10.42.1.5:80", KeyType: nftables.TypeIPAddr, HasTimeout: true}
		if err := c.SetAddElements(sticky, []nftables.SetElement{{Key: []byte{10, 42, 3, 3}, Timeout: 30 * time.Second}}); err != nil {
			t.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			t.Fatalf("add an affinity entry: %v", err)
		}
		if err := Apply(c, cidr, ports); err != nil {
			t.Fatal(err)
		}
		if elems, err := c.GetSetElements(sticky); err != nil || len(elems) != 1 || elems[0].Expires <= 0 || elems[0].Expires > 30*time.Second {
			t.Errorf("affinity entries after a sync: %+v %v, want the one client with its time left", elems, err)
		}
		tables, err := c.ListTables()
		if err != nil || len(tables) != 1 || tables[0].Name != Table {
			t.Fatalf("tables %v, %v", tables, err)
		}
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
		if err != nil {
			t.Fatal(err)
		}
		// services, prerouting, output, postrouting, three filter chains;
		// a chain per Service port with endpoints and per endpoint, and
		// an external chain for externalTrafficPolicy Local.
		if got, want := len(chains), 7+5+7+1; got != want {
			t.Errorf("%d chains, want %d", got, want)
		}
		set, err := c.GetSetByName(tables[0], "service-ips")
		if err != nil {
			t.Fatal(err)
		}
		elems, err := c.GetSetElements(set)
		if err != nil || len(elems) != 4 {
			t.Errorf("service-ips holds %d elements (%v), want 4 (three ClusterIPs, an external IP)", len(elems), err)
		}
		set, err = c.GetSetByName(tables[0], "no-endpoints")
		if err != nil {
			t.Fatal(err)
		}
		if elems, err := c.GetSetElements(set); err != nil || len(elems) != 1 {
			t.Errorf("no-endpoints holds %d elements (%v), want 1", len(elems), err)
		}
		set, err = c.GetSetByName(tables[0], "service-nodeports")
		if err != nil {
			t.Fatal(err)
		}
		if elems, err := c.GetSetElements(set); err != nil || len(elems) != 3 {
			t.Errorf("service-nodeports holds %d elements (%v), want 3 (two NodePorts, a hostPort)", len(elems), err)
		}
	})
}

// A table of a few hundred Services is one batch far larger than a netlink
// socket of the default size holds; kelp's connections carry it.
func TestApplyManyServices(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		c, err := nft.New()
		if err != nil {
			t.Fatal(err)
		}
		var ports []Port
		for i := range 300 {
			p := Port{ClusterIP: netip.AddrFrom4([4]byte{10, 43, byte(i / 250), byte(i%250 + 1)}), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: uint16(30000 + i)}
			for j := range 10 {
				p.Endpoints = append(p.Endpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 42, byte(i / 250), byte(j + 10)}), 8080))
			}
			ports = append(ports, p)
		}
		for range 2 {
			if err := Apply(c, netip.MustParsePrefix("10.42.0.0/16"), ports); err != nil {
				t.Fatal(err)
			}
		}
	})
}
