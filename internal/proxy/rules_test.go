package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
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
		cidr := []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16")}
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
			if err := Apply(c, []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16")}, ports); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestServicesAnswer connects through the tables Apply makes, from the
// node and from a pod, in a network namespace with a pod network of each
// family: in either family a ClusterIP and a NodePort lead to their
// endpoint, which answers, and a ClusterIP without endpoints refuses (a
// pod's UDP by the family's own ICMP port unreachable: ICMPv6's code 3
// would be "address unreachable").
func TestServicesAnswer(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		pod := newPodNetwork(t)
		for _, ep := range []string{"10.42.0.5:8080", "[fd42::5]:8080"} {
			l, err := net.Listen("tcp", ep)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					fmt.Fprintf(c, "%s answers", ep)
					c.Close()
				}
			}()
		}
		ports := []Port{
			{ClusterIP: netip.MustParseAddr("10.43.0.20"), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: 30080, Endpoints: addrPorts("10.42.0.5:8080")},
			{ClusterIP: netip.MustParseAddr("fd43::20"), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: 30080, Endpoints: addrPorts("[fd42::5]:8080")},
			{ClusterIP: netip.MustParseAddr("10.43.0.30"), Protocol: unix.IPPROTO_TCP, Port: 80},
			{ClusterIP: netip.MustParseAddr("fd43::30"), Protocol: unix.IPPROTO_TCP, Port: 80},
			{ClusterIP: netip.MustParseAddr("10.43.0.30"), Protocol: unix.IPPROTO_UDP, Port: 53},
			{ClusterIP: netip.MustParseAddr("fd43::30"), Protocol: unix.IPPROTO_UDP, Port: 53},
		}
		c, err := nft.New()
		if err != nil {
			t.Fatal(err)
		}
		if err := Apply(c, testCIDRs, ports); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			from        string // "node" or "pod"
			network, to string
			answer      string // "": refused
		}{
			{"node", "tcp", "10.43.0.20:80", "10.42.0.5:8080 answers"},
			{"node", "tcp", "10.42.0.1:30080", "10.42.0.5:8080 answers"},
			{"node", "tcp", "[fd43::20]:80", "[fd42::5]:8080 answers"},
			{"node", "tcp", "[fd42::1]:30080", "[fd42::5]:8080 answers"},
			{"node", "tcp", "10.43.0.30:80", ""},
			{"node", "tcp", "[fd43::30]:80", ""},
			{"pod", "tcp", "10.43.0.20:80", "10.42.0.5:8080 answers"},
			{"pod", "tcp", "[fd43::20]:80", "[fd42::5]:8080 answers"},
			{"pod", "tcp", "[fd42::1]:30080", "[fd42::5]:8080 answers"},
			{"pod", "tcp", "[fd43::30]:80", ""},
			{"pod", "tcp", "10.43.0.30:80", ""},
			{"pod", "udp", "10.43.0.30:53", ""},
			{"pod", "udp", "[fd43::30]:53", ""},
		} {
			var got string
			exchange := func() error {
				var err error
				got, err = exchange(tc.network, tc.to)
				return err
			}
			if tc.from == "pod" {
				err = pod.Do(exchange)
			} else {
				err = exchange()
			}
			switch {
			case tc.answer == "" && !errors.Is(err, unix.ECONNREFUSED):
				t.Errorf("%s %s to %s: %q, %v; want connection refused", tc.from, tc.network, tc.to, got, err)
			case tc.answer != "" && (err != nil || got != tc.answer):
				t.Errorf("%s %s to %s: %q, %v; want %q", tc.from, tc.network, tc.to, got, err, tc.answer)
			}
		}
	})
}

// newPodNetwork makes a pod: a network namespace with an address of each
// family, 10.42.0.9 and fd42::9, behind the node's (the caller's) pods
// interface, which has 10.42.0.1 and fd42::1, and endpoints 10.42.0.5 and
// fd42::5 (on the node: what matters is the DNAT, not where the endpoint
// is). The service networks are not the pods', and routed elsewhere (as
// by a node's default route).
func newPodNetwork(t *testing.T) *testcluster.Netns {
	t.Helper()
	pod := testcluster.NewNetns(t)
	for _, err := range []error{
		netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pods"}, PeerName: "eth0"}),
		netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink"}, PeerName: "uplink-peer"}),
		linkDo("eth0", func(l netlink.Link) error { return netlink.LinkSetNsFd(l, pod.FD) }),
		addrs("pods", "10.42.0.1/24", "10.42.0.5/24", "fd42::1/64", "fd42::5/64"),
		linkDo("lo", netlink.LinkSetUp),
		linkDo("pods", netlink.LinkSetUp),
		linkDo("uplink", netlink.LinkSetUp),
		linkDo("uplink-peer", netlink.LinkSetUp),
		routes("uplink", "10.43.0.0/16", "fd43::/112"),
		os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644),
		os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644),
		pod.Do(func() error {
			return errors.Join(
				addrs("eth0", "10.42.0.9/24", "fd42::9/64"),
				linkDo("lo", netlink.LinkSetUp),
				linkDo("eth0", netlink.LinkSetUp),
				defaultRoutes("eth0", "10.42.0.1", "fd42::1"))
		}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return pod
}

// TestForgetUDPFlows checks that the conntrack entries of a UDP flow from
// a pod through a ClusterIP to an endpoint that went are deleted, in
// either family.
func TestForgetUDPFlows(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		pod := newPodNetwork(t)
		for _, ep := range []string{"10.42.0.5:5353", "[fd42::5]:5353"} {
			l, err := net.ListenPacket("udp", ep)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				b := make([]byte, 512)
				for {
					n, from, err := l.ReadFrom(b)
					if err != nil {
						return
					}
					_, _ = l.WriteTo(b[:n], from)
				}
			}()
		}
		ports := []Port{
			{ClusterIP: netip.MustParseAddr("10.43.0.53"), Protocol: unix.IPPROTO_UDP, Port: 53, NodePort: 30053, Endpoints: addrPorts("10.42.0.5:5353")},
			{ClusterIP: netip.MustParseAddr("fd43::53"), Protocol: unix.IPPROTO_UDP, Port: 53, NodePort: 30053, Endpoints: addrPorts("[fd42::5]:5353")},
		}
		c, err := nft.New()
		if err != nil {
			t.Fatal(err)
		}
		if err := Apply(c, testCIDRs, ports); err != nil {
			t.Fatal(err)
		}
		for _, to := range []string{"10.43.0.53:53", "[fd43::53]:53", "10.42.0.1:30053", "[fd42::1]:30053"} {
			if err := pod.Do(func() error {
				got, err := exchange("udp", to)
				if err == nil && got != "hello\n" {
					err = fmt.Errorf("answer %q", got)
				}
				return err
			}); err != nil {
				t.Fatalf("UDP to %s: %v", to, err)
			}
		}
		flowsTo := func(family netlink.InetFamily, ep string) int {
			flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, family)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, f := range flows {
				if f.Reverse.SrcIP.Equal(net.ParseIP(ep)) {
					n++
				}
			}
			return n
		}
		for _, f := range []struct {
			family netlink.InetFamily
			ep     string
		}{{netlink.FAMILY_V4, "10.42.0.5"}, {netlink.FAMILY_V6, "fd42::5"}} {
			if n := flowsTo(f.family, f.ep); n != 2 {
				t.Fatalf("%d flows to %s before, want 2 (through the ClusterIP and the NodePort)", n, f.ep)
			}
		}
		// Both endpoints go.
		if err := forget(staleUDPFlows(ports, nil)); err != nil {
			t.Fatal(err)
		}
		for _, f := range []struct {
			family netlink.InetFamily
			ep     string
		}{{netlink.FAMILY_V4, "10.42.0.5"}, {netlink.FAMILY_V6, "fd42::5"}} {
			if n := flowsTo(f.family, f.ep); n != 0 {
				t.Errorf("%d flows to %s after, want none", n, f.ep)
			}
		}
	})
}

// exchange connects to to, sends a line (UDP needs one for an answer),
// and reads the answer.
func exchange(network, to string) (string, error) {
	conn, err := net.DialTimeout(network, to, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if network == "udp" {
		if _, err := conn.Write([]byte("hello\n")); err != nil {
			return "", err
		}
		b := make([]byte, 512)
		n, err := conn.Read(b)
		return string(b[:n]), err
	}
	b, err := io.ReadAll(conn)
	return string(b), err
}

// addrs adds addresses to the link called name, usable at once (no
// duplicate address detection).
func addrs(name string, cidrs ...string) error {
	return linkDo(name, func(l netlink.Link) error { return testcluster.AddAddrs(l, cidrs...) })
}

// routes routes networks to the link called name.
func routes(name string, dsts ...string) error {
	return linkDo(name, func(l netlink.Link) error {
		for _, dst := range dsts {
			_, ipnet, err := net.ParseCIDR(dst)
			if err != nil {
				return err
			}
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipnet}); err != nil {
				return fmt.Errorf("route %s to %s: %w", dst, name, err)
			}
		}
		return nil
	})
}

// defaultRoutes routes everything through gateways on the link called
// name.
func defaultRoutes(name string, gateways ...string) error {
	return linkDo(name, func(l netlink.Link) error {
		for _, gw := range gateways {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
				return fmt.Errorf("default route via %s: %w", gw, err)
			}
		}
		return nil
	})
}

// TestApplyTablesOfTheClusterFamilies checks that Apply keeps a table for
// each family of the cluster CIDRs and no other: a node of a cluster that
// is no longer dual-stack loses the IPv6 table.
func TestApplyTablesOfTheClusterFamilies(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		c, err := nft.New()
		if err != nil {
			t.Fatal(err)
		}
		ports := []Port{
			{ClusterIP: netip.MustParseAddr("10.43.0.20"), Protocol: unix.IPPROTO_TCP, Port: 80, Endpoints: addrPorts("10.42.0.5:8080")},
			{ClusterIP: netip.MustParseAddr("fd43::20"), Protocol: unix.IPPROTO_TCP, Port: 80, Endpoints: addrPorts("[fd42::5]:8080")},
		}
		v4, v6 := testCIDRs[:1], testCIDRs[1:]
		for _, step := range []struct {
			cidrs []netip.Prefix
			want  []string
		}{
			{v4, []string{"ip"}},
			{testCIDRs, []string{"ip", "ip6"}},
			{v4, []string{"ip"}},
			{v6, []string{"ip6"}},
		} {
			if err := Apply(c, step.cidrs, ports); err != nil {
				t.Fatal(err)
			}
			tables, err := c.ListTables()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, table := range tables {
				if table.Name == Table {
					got = append(got, tableName(familyOfTable(table)))
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, step.want) {
				t.Errorf("cluster CIDRs %v: tables %v, want %v", step.cidrs, got, step.want)
			}
			// Each table: the 7 of its base, a Service port and its endpoint.
			if n, want := countChains(c, step.cidrs), 9*len(step.cidrs); n != want {
				t.Errorf("cluster CIDRs %v: %d chains, want %d", step.cidrs, n, want)
			}
		}
	})
}

// linkDo runs f on the link called name in the thread's namespace.
func linkDo(name string, f func(netlink.Link) error) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return f(l)
}
