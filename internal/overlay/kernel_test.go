package overlay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/cni"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// netns is a network namespace of the test's (testcluster.Netns) that
// dials.
type netns struct{ *testcluster.Netns }

func newNetns(t *testing.T) *netns { return &netns{testcluster.NewNetns(t)} }

// dial connects to addr over TCP from the namespace and hangs up.
func (n *netns) dial(addr string) error {
	return n.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// inOrder runs the steps one after the other, stopping at the
// first error.
func inOrder(steps ...func() error) error {
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

func addAddr(name, cidr string) func() error {
	return func() error {
		link, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return testcluster.AddAddrs(link, cidr)
	}
}

func setUp(name string) func() error {
	return func() error {
		link, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(link)
	}
}

func addLink(link netlink.Link) func() error {
	return func() error {
		if err := netlink.LinkAdd(link); err != nil {
			return fmt.Errorf("add %s: %w", link.Attrs().Name, err)
		}
		return nil
	}
}

// addUplink gives the thread's namespace an uplink0 with the addresses in
// the comma-separated list addrs, up, whose other end uplink1 is up too so
// that it has a carrier.
func addUplink(addrs string) error {
	steps := []func() error{addLink(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "uplink1"})}
	for _, addr := range strings.Split(addrs, ",") {
		steps = append(steps, addAddr("uplink0", addr))
	}
	return inOrder(append(steps, setUp("uplink0"), setUp("uplink1"))...)
}

// state is what there is of routes, neighbours and the VXLAN device in the
// thread's namespace, in words and sorted, to compare with what a test
// wants.
type state struct {
	Device string
	Addrs  []string // of the device
	Routes []string // in all tables, except the kernel's own
	Neighs []string // permanent ones, on any device
	FDB    []string // of the device
	// Table holds the sets of the overlay's table, as "peers4 {10.99.0.3}
	// peers6 {}"; "" without the table.
	Table string
}

func dump() (state, error) {
	var s state
	names := map[int]string{}
	links, err := netlink.LinkList()
	if err != nil {
		return s, err
	}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return s, err
	}
	for _, r := range routes {
		if r.Protocol == unix.RTPROT_KERNEL {
			continue
		}
		route := fmt.Sprintf("%s via %s dev %s proto %#x", r.Dst, r.Gw, names[r.LinkIndex], int(r.Protocol))
		if r.Flags&int(netlink.FLAG_ONLINK) != 0 {
			route += " onlink"
		}
		s.Routes = append(s.Routes, route)
	}
	neighs, err := netlink.NeighList(0, netlink.FAMILY_V4)
	if err != nil {
		return s, err
	}
	neighs6, err := netlink.NeighList(0, netlink.FAMILY_V6)
	if err != nil {
		return s, err
	}
	for _, n := range append(neighs, neighs6...) {
		if n.State&netlink.NUD_PERMANENT != 0 {
			s.Neighs = append(s.Neighs, fmt.Sprintf("%s lladdr %s dev %s", n.IP, n.HardwareAddr, names[n.LinkIndex]))
		}
	}
	// Run may replace the table while a test beside it reads it: read
	// again.
	for try := 1; ; try++ {
		if s.Table, err = dumpTable(); err == nil {
			break
		}
		if try == 3 {
			return s, err
		}
	}
	link, err := netlink.LinkByName(Device)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return s, nil
	}
	if err != nil {
		return s, err
	}
	v, ok := link.(*netlink.Vxlan)
	if !ok {
		return s, fmt.Errorf("%s is a %s", Device, link.Type())
	}
	s.Device = fmt.Sprintf("vni %d port %d local %s parent %s learning %v mtu %d mac %s up %v",
		v.VxlanId, v.Port, v.SrcAddr, names[v.VtepDevIndex], v.Learning, v.MTU, v.HardwareAddr, v.Flags&net.FlagUp != 0)
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return s, err
	}
	for _, a := range addrs {
		if !a.IP.IsLinkLocalUnicast() { // the kernel's own
			s.Addrs = append(s.Addrs, a.IPNet.String())
		}
	}
	fdb, err := netlink.NeighList(link.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return s, err
	}
	for _, n := range fdb {
		s.FDB = append(s.FDB, fmt.Sprintf("%s dst %s", n.HardwareAddr, n.IP))
	}
	for _, l := range [][]string{s.Addrs, s.Routes, s.Neighs, s.FDB} {
		slices.Sort(l)
	}
	return s, nil
}

// dumpTable is the Table of state.
func dumpTable() (string, error) {
	c, err := nftables.New()
	if err != nil {
		return "", err
	}
	tables, err := c.ListTablesOfFamily(table.Family)
	if err != nil || !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == Table }) {
		return "", err
	}
	sets, err := c.GetSets(table)
	if err != nil {
		return "", err
	}
	slices.SortFunc(sets, func(a, b *nftables.Set) int { return strings.Compare(a.Name, b.Name) })
	var out []string
	for _, set := range sets {
		elems, err := c.GetSetElements(set)
		if err != nil {
			return "", fmt.Errorf("elements of %s: %w", set.Name, err)
		}
		var ips []netip.Addr
		for _, e := range elems {
			ip, _ := netip.AddrFromSlice(e.Key)
			ips = append(ips, ip)
		}
		slices.SortFunc(ips, netip.Addr.Compare)
		words := make([]string, len(ips))
		for i, ip := range ips {
			words[i] = ip.String()
		}
		out = append(out, fmt.Sprintf("%s {%s}", set.Name, strings.Join(words, " ")))
	}
	return strings.Join(out, " "), nil
}

func (s state) String() string {
	return fmt.Sprintf("device: %s\naddrs:\n\t%s\nroutes:\n\t%s\nneighbours:\n\t%s\nFDB:\n\t%s\ntable: %s", s.Device,
		strings.Join(s.Addrs, "\n\t"), strings.Join(s.Routes, "\n\t"), strings.Join(s.Neighs, "\n\t"), strings.Join(s.FDB, "\n\t"), s.Table)
}

// checkState compares the namespace with want.
func checkState(t *testing.T, when string, want state) {
	t.Helper()
	got, err := dump()
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n%s\nwant\n%s", when, got, want)
	}
}

// peerOf is the peer of the pod CIDRs and node IPs in the
// comma-separated lists podCIDRs and ips.
func peerOf(name, podCIDRs, ips string, mac net.HardwareAddr) Peer {
	return Peer{Name: name, PodCIDRs: prefixes(podCIDRs), IPs: addrs(ips), MAC: mac}
}

// localOf is this node's end over the node IP ip, its only one, with the
// pod CIDRs in the comma-separated list podCIDRs.
func localOf(backend, ip, podCIDRs string) local {
	return local{backend: backend, ip: netip.MustParseAddr(ip), uplinks: map[family]string{familyOf(netip.MustParseAddr(ip)): "uplink0"},
		mac: vtepMAC("node-a"), podCIDRs: prefixes(podCIDRs)}
}

// TestProgram programs peers, changes and removes them, and repairs what
// was changed behind kelp's back, leaving others' routes and neighbours
// alone.
func TestProgram(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		macA, macB, macC, macD := vtepMAC("node-a"), vtepMAC("node-b"), vtepMAC("node-c"), vtepMAC("node-d")
		foreignNeigh := func() error {
			link, err := netlink.LinkByName("uplink0")
			if err != nil {
				return err
			}
			return netlink.NeighAdd(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
				IP: net.ParseIP("10.99.0.50"), HardwareAddr: mac("0a:00:00:00:00:50")})
		}
		foreignRoute := func(dst, gw string, proto netlink.RouteProtocol) func() error {
			return func() error {
				link, err := netlink.LinkByName("uplink0")
				if err != nil {
					return err
				}
				return netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: prefixNet(netip.MustParsePrefix(dst)),
					Gw: net.ParseIP(gw), Protocol: proto})
			}
		}
		// Someone's kelp.vxlan with another VNI, learning on.
		wrong := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: Device}, VxlanId: 2, Port: vxlanPort, Learning: true}
		if err := inOrder(
			func() error { return addUplink("10.99.0.2/24") },
			foreignNeigh,
			foreignRoute("192.0.2.0/24", "10.99.0.1", unix.RTPROT_STATIC),
			foreignRoute("10.42.9.0/24", "10.99.0.9", unix.RTPROT_BOOT),
			addLink(wrong),
		); err != nil {
			t.Fatal(err)
		}
		others := []string{"10.42.9.0/24 via 10.99.0.9 dev uplink0 proto 0x3", "192.0.2.0/24 via 10.99.0.1 dev uplink0 proto 0x4"}
		foreignNeighs := []string{"10.99.0.50 lladdr 0a:00:00:00:00:50 dev uplink0"}

		a := localOf(BackendVXLAN, "10.99.0.2", "10.42.0.0/24")
		peers := []Peer{peerOf("node-b", "10.42.1.0/24", "10.99.0.3", macB), peerOf("node-c", "10.42.2.0/24", "10.99.0.4", macC)}
		want := state{
			Device: fmt.Sprintf("vni 1 port 8472 local 10.99.0.2 parent uplink0 learning false mtu 1450 mac %s up true", macA),
			Addrs:  []string{"10.42.0.0/32"},
			Routes: append([]string{
				"10.42.1.0/24 via 10.42.1.0 dev kelp.vxlan proto 0x6b onlink",
				"10.42.2.0/24 via 10.42.2.0 dev kelp.vxlan proto 0x6b onlink",
			}, others...),
			Neighs: append([]string{
				fmt.Sprintf("10.42.1.0 lladdr %s dev kelp.vxlan", macB),
				fmt.Sprintf("10.42.2.0 lladdr %s dev kelp.vxlan", macC),
			}, foreignNeighs...),
			FDB:   []string{fmt.Sprintf("%s dst 10.99.0.3", macB), fmt.Sprintf("%s dst 10.99.0.4", macC)},
			Table: "peers4 {10.99.0.3 10.99.0.4} peers6 {}",
		}
		slices.Sort(want.Routes)
		slices.Sort(want.Neighs)
		slices.Sort(want.FDB)
		if err := program(a, peers); err != nil {
			t.Fatal(err)
		}
		checkState(t, "vxlan", want)
		if err := program(a, peers); err != nil {
			t.Fatal(err)
		}
		checkState(t, "vxlan programmed again", want)

		// Behind kelp's back: an entry of node-b's and one of node-c's
		// go, stale ones come, the device changes and goes down, the
		// table goes.
		dev, err := netlink.LinkByName(Device)
		if err != nil {
			t.Fatal(err)
		}
		idx := dev.Attrs().Index
		if err := inOrder(
			func() error {
				return netlink.RouteDel(&netlink.Route{LinkIndex: idx, Dst: prefixNet(netip.MustParsePrefix("10.42.1.0/24"))})
			},
			func() error {
				return netlink.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, HardwareAddr: macC, IP: net.ParseIP("10.99.0.4")})
			},
			func() error {
				return netlink.NeighAdd(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
					IP: net.ParseIP("10.42.7.0"), HardwareAddr: mac("0a:00:00:00:00:07")})
			},
			func() error {
				return netlink.NeighAdd(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT,
					HardwareAddr: mac("0a:00:00:00:00:07"), IP: net.ParseIP("10.99.0.7")})
			},
			foreignRoute("10.42.7.0/24", "10.99.0.7", protocol),
			addAddr(Device, "10.42.7.0/32"),
			func() error { return netlink.LinkSetHardwareAddr(dev, mac("0a:00:00:00:00:99")) },
			func() error { return netlink.LinkSetMTU(dev, 1300) },
			func() error { return netlink.LinkSetDown(dev) },
			func() error {
				c, err := nftables.New()
				if err != nil {
					return err
				}
				c.DelTable(table)
				return c.Flush()
			},
		); err != nil {
			t.Fatal(err)
		}
		if err := program(a, peers); err != nil {
			t.Fatal(err)
		}
		checkState(t, "vxlan repaired", want)

		// node-b moves to another IP, node-c gets another MAC and pod
		// CIDR, node-d joins; this node gets another pod CIDR and its
		// uplink a smaller MTU.
		macC2 := mac("0a:00:00:00:00:0c")
		a.podCIDRs = prefixes("10.42.10.0/24")
		peers = []Peer{
			peerOf("node-b", "10.42.1.0/24", "10.99.0.13", macB),
			peerOf("node-c", "10.42.5.0/24", "10.99.0.4", macC2),
			peerOf("node-d", "10.42.3.0/24", "10.99.0.5", macD),
		}
		up, err := netlink.LinkByName("uplink0")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetMTU(up, 1400); err != nil {
			t.Fatal(err)
		}
		if err := program(a, peers); err != nil {
			t.Fatal(err)
		}
		want = state{
			Device: fmt.Sprintf("vni 1 port 8472 local 10.99.0.2 parent uplink0 learning false mtu 1350 mac %s up true", macA),
			Addrs:  []string{"10.42.10.0/32"},
			Routes: append([]string{
				"10.42.1.0/24 via 10.42.1.0 dev kelp.vxlan proto 0x6b onlink",
				"10.42.3.0/24 via 10.42.3.0 dev kelp.vxlan proto 0x6b onlink",
				"10.42.5.0/24 via 10.42.5.0 dev kelp.vxlan proto 0x6b onlink",
			}, others...),
			Neighs: append([]string{
				fmt.Sprintf("10.42.1.0 lladdr %s dev kelp.vxlan", macB),
				fmt.Sprintf("10.42.3.0 lladdr %s dev kelp.vxlan", macD),
				fmt.Sprintf("10.42.5.0 lladdr %s dev kelp.vxlan", macC2),
			}, foreignNeighs...),
			FDB:   []string{fmt.Sprintf("%s dst 10.99.0.13", macB), fmt.Sprintf("%s dst 10.99.0.4", macC2), fmt.Sprintf("%s dst 10.99.0.5", macD)},
			Table: "peers4 {10.99.0.4 10.99.0.5 10.99.0.13} peers6 {}",
		}
		slices.Sort(want.Routes)
		slices.Sort(want.Neighs)
		slices.Sort(want.FDB)
		checkState(t, "vxlan peers changed", want)

		// A new node IP needs a new device.
		if err := addAddr("uplink0", "10.99.0.20/24")(); err != nil {
			t.Fatal(err)
		}
		a.ip = netip.MustParseAddr("10.99.0.20")
		if err := program(a, peers); err != nil {
			t.Fatal(err)
		}
		want.Device = strings.Replace(want.Device, "local 10.99.0.2 ", "local 10.99.0.20 ", 1)
		checkState(t, "vxlan with a new node IP", want)

		// The switch to host-gw takes the device, its entries and the
		// table away.
		hostGW := localOf(BackendHostGW, "10.99.0.2", "10.42.0.0/24")
		if err := program(hostGW, []Peer{peerOf("node-b", "10.42.1.0/24", "10.99.0.3", nil), peerOf("node-d", "10.42.3.0/24", "10.99.0.5", nil)}); err != nil {
			t.Fatal(err)
		}
		want = state{
			Routes: append([]string{
				"10.42.1.0/24 via 10.99.0.3 dev uplink0 proto 0x6b",
				"10.42.3.0/24 via 10.99.0.5 dev uplink0 proto 0x6b",
			}, others...),
			Neighs: foreignNeighs,
		}
		slices.Sort(want.Routes)
		checkState(t, "host-gw", want)

		// A peer that cannot be routed to does not keep the others out.
		err = program(hostGW, []Peer{peerOf("node-b", "10.42.1.0/24", "10.99.0.3", nil), peerOf("far", "10.42.4.0/24", "192.0.2.99", nil)})
		if err == nil || !strings.Contains(err.Error(), "10.42.4.0/24") {
			t.Errorf("program with a peer off the uplink's subnet: %v, want an error about its route", err)
		}
		want.Routes = append([]string{"10.42.1.0/24 via 10.99.0.3 dev uplink0 proto 0x6b"}, others...)
		checkState(t, "host-gw with an unreachable peer", want)

		for range 2 { // removing what is gone is no error
			if err := Remove(); err != nil {
				t.Fatal(err)
			}
		}
		checkState(t, "after Remove", state{Routes: others, Neighs: foreignNeighs})

		if err := program(a, peers); err != nil {
			t.Fatal(err)
		}
		if err := Remove(); err != nil {
			t.Fatal(err)
		}
		checkState(t, "after vxlan and Remove", state{Routes: others, Neighs: foreignNeighs})
	})
}

func TestMTU(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		if err := inOrder(
			func() error { return addUplink("10.99.0.2/24,fd99::2/64") },
			addLink(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink6", MTU: 1300}, PeerName: "uplink7"}),
			addAddr("uplink6", "fd98::2/64"),
		); err != nil {
			t.Fatal(err)
		}
		up, err := netlink.LinkByName("uplink0")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetMTU(up, 1400); err != nil {
			t.Fatal(err)
		}
		const v4, dual, dual6, only6 = "10.42.0.0/16", "10.42.0.0/16,fd42::/56", "fd42::/56,10.42.0.0/16", "fd42::/56"
		for _, tc := range []struct {
			backend, iface, ips, cidrs string
			want                       int
			err                        string
		}{
			{backend: BackendVXLAN, ips: "10.99.0.2", cidrs: v4, want: 1350},
			{backend: BackendHostGW, ips: "10.99.0.2", cidrs: v4, want: 1400},
			{backend: BackendNone, ips: "10.99.0.2", cidrs: v4, want: 1400},
			{backend: BackendVXLAN, iface: "uplink1", ips: "10.99.0.2", cidrs: v4, want: 1450},
			{backend: BackendVXLAN, ips: "10.99.0.3", cidrs: v4, err: "no interface has the node IP 10.99.0.3"},
			{backend: BackendVXLAN, iface: "eth9", ips: "10.99.0.2", cidrs: v4, err: "interface eth9"},
			// The IPv6 header is 20 bytes longer.
			{backend: BackendVXLAN, ips: "fd99::2", cidrs: only6, want: 1330},
			{backend: BackendVXLAN, iface: "uplink1", ips: "fd99::2", cidrs: only6, want: 1430},
			{backend: BackendVXLAN, ips: "10.99.0.2,fd99::2", cidrs: dual, want: 1350},
			{backend: BackendVXLAN, ips: "10.99.0.2,fd99::2", cidrs: dual6, want: 1330},
			{backend: BackendVXLAN, ips: "10.99.0.2,fd99::3", cidrs: dual6, err: "no interface has the node IP fd99::3"},
			// host-gw: the least MTU of the uplinks of both families.
			{backend: BackendHostGW, ips: "10.99.0.2,fd99::2", cidrs: dual, want: 1400},
			{backend: BackendHostGW, ips: "10.99.0.2,fd98::2", cidrs: dual, want: 1300},
			{backend: BackendHostGW, ips: "10.99.0.2,fd98::2", cidrs: v4, want: 1400},
		} {
			cfg := configOf(tc.backend, tc.ips, tc.cidrs)
			cfg.Iface = tc.iface
			got, err := MTU(cfg)
			if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("MTU(%+v) = %d, %v; want %d, %q", cfg, got, err, tc.want, tc.err)
			}
		}
	})
}

// TestProgramDualStack programs peers of both families over each
// family, checks what there is, and that what kelp programmed of a family
// the cluster no longer has goes.
func TestProgramDualStack(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		if err := addUplink("10.99.0.2/24,fd99::2/64"); err != nil {
			t.Fatal(err)
		}
		macA, macB, macC := vtepMAC("node-a"), vtepMAC("node-b"), vtepMAC("node-c")
		both := map[family]string{ipv4: "uplink0", ipv6: "uplink0"}
		overV4 := local{backend: BackendVXLAN, ip: netip.MustParseAddr("10.99.0.2"), uplinks: both, mac: macA,
			podCIDRs: prefixes("10.42.0.0/24,fd42::/64")}
		peers := []Peer{
			peerOf("node-b", "10.42.1.0/24,fd42:0:0:1::/64", "10.99.0.3,fd99::3", macB),
			peerOf("node-c", "10.42.2.0/24,fd42:0:0:2::/64", "10.99.0.4,fd99::4", macC),
		}
		sorted := func(s state) state {
			for _, l := range [][]string{s.Addrs, s.Routes, s.Neighs, s.FDB} {
				slices.Sort(l)
			}
			return s
		}
		vxlanRoutes := []string{
			"10.42.1.0/24 via 10.42.1.0 dev kelp.vxlan proto 0x6b onlink",
			"10.42.2.0/24 via 10.42.2.0 dev kelp.vxlan proto 0x6b onlink",
			"fd42:0:0:1::/64 via fd42:0:0:1:: dev kelp.vxlan proto 0x6b onlink",
			"fd42:0:0:2::/64 via fd42:0:0:2:: dev kelp.vxlan proto 0x6b onlink",
		}
		vxlanNeighs := []string{
			fmt.Sprintf("10.42.1.0 lladdr %s dev kelp.vxlan", macB),
			fmt.Sprintf("10.42.2.0 lladdr %s dev kelp.vxlan", macC),
			fmt.Sprintf("fd42:0:0:1:: lladdr %s dev kelp.vxlan", macB),
			fmt.Sprintf("fd42:0:0:2:: lladdr %s dev kelp.vxlan", macC),
		}
		want := sorted(state{
			Device: fmt.Sprintf("vni 1 port 8472 local 10.99.0.2 parent uplink0 learning false mtu 1450 mac %s up true", macA),
			Addrs:  []string{"10.42.0.0/32", "fd42::/128"},
			Routes: slices.Clone(vxlanRoutes),
			Neighs: slices.Clone(vxlanNeighs),
			FDB:    []string{fmt.Sprintf("%s dst 10.99.0.3", macB), fmt.Sprintf("%s dst 10.99.0.4", macC)},
			Table:  "peers4 {10.99.0.3 10.99.0.4} peers6 {fd99::3 fd99::4}",
		})
		for _, when := range []string{"vxlan over IPv4", "vxlan over IPv4 programmed again"} {
			if err := program(overV4, peers); err != nil {
				t.Fatal(err)
			}
			checkState(t, when, want)
		}

		// Over IPv6 the device is made anew, 20 bytes smaller.
		overV6 := overV4
		overV6.ip = netip.MustParseAddr("fd99::2")
		if err := program(overV6, peers); err != nil {
			t.Fatal(err)
		}
		want.Device = fmt.Sprintf("vni 1 port 8472 local fd99::2 parent uplink0 learning false mtu 1430 mac %s up true", macA)
		want.FDB = []string{fmt.Sprintf("%s dst fd99::3", macB), fmt.Sprintf("%s dst fd99::4", macC)}
		want = sorted(want)
		checkState(t, "vxlan over IPv6", want)

		// The cluster drops IPv4: its address, routes and neighbours go.
		v6Only := overV6
		v6Only.podCIDRs = prefixes("fd42::/64")
		if err := program(v6Only, []Peer{
			peerOf("node-b", "fd42:0:0:1::/64", "10.99.0.3,fd99::3", macB),
			peerOf("node-c", "fd42:0:0:2::/64", "fd99::4", macC),
		}); err != nil {
			t.Fatal(err)
		}
		want.Addrs, want.Routes, want.Neighs = []string{"fd42::/128"}, vxlanRoutes[2:], vxlanNeighs[2:]
		want.Table = "peers4 {10.99.0.3} peers6 {fd99::3 fd99::4}"
		checkState(t, "vxlan over IPv6, IPv6 only", want)

		// Back to both families over IPv4, then the cluster drops IPv6.
		if err := program(overV4, peers); err != nil {
			t.Fatal(err)
		}
		v4Only := overV4
		v4Only.podCIDRs = prefixes("10.42.0.0/24")
		if err := program(v4Only, []Peer{
			peerOf("node-b", "10.42.1.0/24", "10.99.0.3,fd99::3", macB),
			peerOf("node-c", "10.42.2.0/24", "10.99.0.4", macC),
		}); err != nil {
			t.Fatal(err)
		}
		checkState(t, "vxlan over IPv4, IPv4 only", sorted(state{
			Device: fmt.Sprintf("vni 1 port 8472 local 10.99.0.2 parent uplink0 learning false mtu 1450 mac %s up true", macA),
			Addrs:  []string{"10.42.0.0/32"},
			Routes: vxlanRoutes[:2],
			Neighs: vxlanNeighs[:2],
			FDB:    []string{fmt.Sprintf("%s dst 10.99.0.3", macB), fmt.Sprintf("%s dst 10.99.0.4", macC)},
			Table:  "peers4 {10.99.0.3 10.99.0.4} peers6 {fd99::3}",
		}))

		// host-gw routes each family via the node IP of that family.
		hostGW := local{backend: BackendHostGW, uplinks: both, podCIDRs: overV4.podCIDRs}
		if err := program(hostGW, []Peer{
			peerOf("node-b", "10.42.1.0/24,fd42:0:0:1::/64", "10.99.0.3,fd99::3", nil),
			peerOf("node-c", "10.42.2.0/24,fd42:0:0:2::/64", "10.99.0.4,fd99::4", nil),
		}); err != nil {
			t.Fatal(err)
		}
		want = sorted(state{Routes: []string{
			"10.42.1.0/24 via 10.99.0.3 dev uplink0 proto 0x6b",
			"10.42.2.0/24 via 10.99.0.4 dev uplink0 proto 0x6b",
			"fd42:0:0:1::/64 via fd99::3 dev uplink0 proto 0x6b",
			"fd42:0:0:2::/64 via fd99::4 dev uplink0 proto 0x6b",
		}})
		checkState(t, "host-gw", want)

		// A node without an IPv6 uplink routes its IPv4 peers, and says
		// why not the IPv6 ones.
		hostGW.uplinks = map[family]string{ipv4: "uplink0"}
		err := program(hostGW, []Peer{peerOf("node-b", "10.42.1.0/24,fd42:0:0:1::/64", "10.99.0.3,fd99::3", nil)})
		if err == nil || !strings.Contains(err.Error(), "route to fd42:0:0:1::/64 of node node-b: no IPv6 node IP") {
			t.Errorf("program host-gw without an IPv6 uplink: %v, want an error about the IPv6 route", err)
		}
		checkState(t, "host-gw without an IPv6 uplink", state{Routes: []string{"10.42.1.0/24 via 10.99.0.3 dev uplink0 proto 0x6b"}})

		if err := program(overV6, peers); err != nil {
			t.Fatal(err)
		}
		if err := Remove(); err != nil {
			t.Fatal(err)
		}
		checkState(t, "after Remove", state{})
	})
}

// TestPodToPod builds two nodes joined by a link, each with a pod of both
// families behind its bridge as the CNI bridge plugin sets it up, and
// checks that the pods reach each other over both with each backend (VXLAN
// over either family), and do not without kelp.
func TestPodToPod(t *testing.T) {
	type side struct {
		name                               string
		ips, podCIDRs, bridgeIPs, podAddrs []string // IPv4, IPv6
		node, pod                          *netns
	}
	sides := []*side{
		{name: "node-a", ips: []string{"10.99.0.2/24", "fd99::2/64"}, podCIDRs: []string{"10.42.0.0/24", "fd42::/64"},
			bridgeIPs: []string{"10.42.0.1/24", "fd42::1/64"}, podAddrs: []string{"10.42.0.5/24", "fd42::5/64"}},
		{name: "node-b", ips: []string{"10.99.0.3/24", "fd99::3/64"}, podCIDRs: []string{"10.42.1.0/24", "fd42:0:0:1::/64"},
			bridgeIPs: []string{"10.42.1.1/24", "fd42:0:0:1::1/64"}, podAddrs: []string{"10.42.1.5/24", "fd42:0:0:1::5/64"}},
	}
	addr := func(cidr string) netip.Addr { return netip.MustParsePrefix(cidr).Addr() }
	for _, s := range sides {
		s.node, s.pod = newNetns(t), newNetns(t)
	}
	a, b := sides[0], sides[1]
	if err := a.node.Do(addLink(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "uplink0", PeerNamespace: netlink.NsFd(b.node.FD)})); err != nil {
		t.Fatal(err)
	}
	for _, s := range sides {
		err := s.node.Do(func() error {
			return inOrder(
				func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) },
				func() error { return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644) },
				addAddr("uplink0", s.ips[0]),
				addAddr("uplink0", s.ips[1]),
				setUp("uplink0"),
				addLink(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cni0"}}),
				addAddr("cni0", s.bridgeIPs[0]),
				addAddr("cni0", s.bridgeIPs[1]),
				setUp("cni0"),
				func() error {
					br, err := netlink.LinkByName("cni0")
					if err != nil {
						return err
					}
					return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0", MasterIndex: br.Attrs().Index},
						PeerName: "eth0", PeerNamespace: netlink.NsFd(s.pod.FD)})
				},
				setUp("veth0"),
			)
		})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		err = s.pod.Do(func() error {
			return inOrder(
				addAddr("eth0", s.podAddrs[0]),
				addAddr("eth0", s.podAddrs[1]),
				setUp("eth0"),
				setUp("lo"),
				func() error { return netlink.RouteAdd(&netlink.Route{Gw: addr(s.bridgeIPs[0]).AsSlice()}) },
				func() error {
					return netlink.RouteAdd(&netlink.Route{Dst: prefixNet(netip.MustParsePrefix("::/0")), Gw: addr(s.bridgeIPs[1]).AsSlice()})
				},
			)
		})
		if err != nil {
			t.Fatalf("pod of %s: %v", s.name, err)
		}
	}
	var podB []string // IPv4, IPv6
	for _, cidr := range b.podAddrs {
		ap := netip.AddrPortFrom(addr(cidr), 8080).String()
		b.pod.Accept(t, "tcp", ap)
		podB = append(podB, ap)
	}

	// programAll programs each node for the other over the node IPs of
	// family over, routing the pod CIDRs of the families in fams; with
	// fams empty, for no peers.
	programAll := func(backend string, over family, fams ...family) {
		t.Helper()
		for i, s := range sides {
			o := sides[1-i]
			l := local{backend: backend, ip: addr(s.ips[0]), uplinks: map[family]string{ipv4: "uplink0", ipv6: "uplink0"}, mac: vtepMAC(s.name)}
			if over == ipv6 {
				l.ip = addr(s.ips[1])
			}
			p := Peer{Name: o.name, IPs: []netip.Addr{addr(o.ips[0]), addr(o.ips[1])}}
			if backend == BackendVXLAN {
				p.MAC = vtepMAC(o.name)
			}
			for _, f := range fams {
				i := map[family]int{ipv4: 0, ipv6: 1}[f]
				l.podCIDRs = append(l.podCIDRs, netip.MustParsePrefix(s.podCIDRs[i]))
				p.PodCIDRs = append(p.PodCIDRs, netip.MustParsePrefix(o.podCIDRs[i]))
			}
			var ps []Peer
			if len(fams) > 0 {
				ps = []Peer{p}
			}
			if err := s.node.Do(func() error { return program(l, ps) }); err != nil {
				t.Fatalf("program %s for %s over %s: %v", s.name, backend, over, err)
			}
		}
	}
	// reach checks that pod A and node A reach pod B over the families
	// in fams, and pod A does not over the others.
	reach := func(when string, fams ...family) {
		t.Helper()
		for i, f := range []family{ipv4, ipv6} {
			if !slices.Contains(fams, f) {
				if err := a.pod.dial(podB[i]); err == nil {
					t.Errorf("%s: pod A reaches pod B over %s", when, f)
				}
				continue
			}
			if err := a.pod.dial(podB[i]); err != nil {
				t.Errorf("%s: pod A cannot reach pod B over %s: %v", when, f, err)
			}
			// The node's own traffic to a remote pod comes back too:
			// over vxlan it leaves with the address of the device.
			if err := a.node.dial(podB[i]); err != nil {
				t.Errorf("%s: node A cannot reach pod B over %s: %v", when, f, err)
			}
		}
	}
	reach("before the overlay is programmed")
	for _, tc := range []struct {
		backend string
		over    family
	}{
		{BackendVXLAN, ipv4},
		{BackendVXLAN, ipv6},
		{BackendHostGW, ipv4},
	} {
		name := tc.backend + " over " + tc.over.String()
		programAll(tc.backend, tc.over, ipv4, ipv6)
		reach(name, ipv4, ipv6)
		programAll(tc.backend, tc.over, ipv4)
		reach(name+", IPv4 only", ipv4)
		programAll(tc.backend, tc.over, ipv6)
		reach(name+", IPv6 only", ipv6)
		programAll(tc.backend, tc.over)
		reach(name + " without peers")
	}
}

// vxlanPacket is the UDP payload of a VXLAN packet to the VTEP MAC to that
// carries an IPv4 UDP datagram of payload from src to dst, as a peer's
// device would send it.
func vxlanPacket(to net.HardwareAddr, src, dst netip.AddrPort, payload string) []byte {
	b := []byte{0x08, 0, 0, 0, 0, 0, vni, 0} // VNI valid, VNI
	b = append(append(b, to...), vtepMAC("node-b")...)
	b = append(b, 0x08, 0x00) // IPv4
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	copy(ip[12:], src.Addr().AsSlice())
	copy(ip[16:], dst.Addr().AsSlice())
	var sum uint32
	for i := 0; i < len(ip); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	b = append(b, ip...)
	b = binary.BigEndian.AppendUint16(b, src.Port())
	b = binary.BigEndian.AppendUint16(b, dst.Port())
	b = binary.BigEndian.AppendUint16(b, uint16(8+len(payload)))
	b = append(b, 0, 0) // no checksum
	return append(b, payload...)
}

// TestVXLANFromPeersOnly sends node A VXLAN packets that carry a datagram
// from a pod of its peer node B to node A's device address: from node B,
// which A takes; from a stranger beside B, and from B's pod (which B
// masquerades to its own node IP), which never arrive. Over IPv4 and IPv6.
func TestVXLANFromPeersOnly(t *testing.T) {
	a, b, pod := newNetns(t), newNetns(t), newNetns(t)
	if err := a.Do(addLink(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "uplink0", PeerNamespace: netlink.NsFd(b.FD)})); err != nil {
		t.Fatal(err)
	}
	route := func(dst string) func() error {
		return func() error {
			up, err := netlink.LinkByName("uplink0")
			if err != nil {
				return err
			}
			return netlink.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Dst: prefixNet(netip.MustParsePrefix(dst))})
		}
	}
	// The stranger's addresses are on B's uplink, but of other networks,
	// so that neither B's packets nor its pod's leave with them. A routes
	// them back, or its reverse path filter would drop them before kelp's
	// table does.
	if err := a.Do(func() error {
		return inOrder(addAddr("uplink0", "10.99.0.2/24"), addAddr("uplink0", "fd99::2/64"), setUp("uplink0"), setUp("lo"),
			route("10.98.0.0/24"), route("fd98::/64"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Do(func() error {
		return inOrder(
			func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) },
			func() error { return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644) },
			addAddr("uplink0", "10.99.0.3/24"), addAddr("uplink0", "fd99::3/64"),
			addAddr("uplink0", "10.98.0.9/24"), addAddr("uplink0", "fd98::9/64"),
			setUp("uplink0"),
			addLink(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(pod.FD)}),
			addAddr("veth0", "10.42.1.1/24"), addAddr("veth0", "fd42:0:0:1::1/64"), setUp("veth0"),
			func() error { return cni.EnsureMasquerade(prefixes("10.42.0.0/16,fd42::/56")) },
		)
	}); err != nil {
		t.Fatal(err)
	}
	if err := pod.Do(func() error {
		return inOrder(addAddr("eth0", "10.42.1.5/24"), addAddr("eth0", "fd42:0:0:1::5/64"), setUp("eth0"),
			func() error { return netlink.RouteAdd(&netlink.Route{Gw: net.ParseIP("10.42.1.1")}) },
			func() error {
				return netlink.RouteAdd(&netlink.Route{Dst: prefixNet(netip.MustParsePrefix("::/0")), Gw: net.ParseIP("fd42:0:0:1::1")})
			})
	}); err != nil {
		t.Fatal(err)
	}
	var listener *net.UDPConn
	if err := a.Do(func() (err error) {
		listener, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 9000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer listener.Close()

	uplinks := map[family]string{ipv4: "uplink0", ipv6: "uplink0"}
	for _, over := range []family{ipv4, ipv6} {
		i := map[family]int{ipv4: 0, ipv6: 1}[over]
		ipA, ipB := addrs("10.99.0.2,fd99::2")[i], addrs("10.99.0.3,fd99::3")[i]
		stranger := addrs("10.98.0.9,fd98::9")[i]
		err := errors.Join(
			a.Do(func() error {
				return program(local{backend: BackendVXLAN, ip: ipA, uplinks: uplinks, mac: vtepMAC("node-a"), podCIDRs: prefixes("10.42.0.0/24")},
					[]Peer{peerOf("node-b", "10.42.1.0/24", "10.99.0.3,fd99::3", vtepMAC("node-b"))})
			}),
			b.Do(func() error {
				return program(local{backend: BackendVXLAN, ip: ipB, uplinks: uplinks, mac: vtepMAC("node-b"), podCIDRs: prefixes("10.42.1.0/24")},
					[]Peer{peerOf("node-a", "10.42.0.0/24", "10.99.0.2,fd99::2", vtepMAC("node-a"))})
			}))
		if err != nil {
			t.Fatalf("program over %s: %v", over, err)
		}
		// send sends a packet tagged tag from the address from, or from
		// the one the kernel picks if from is nil.
		send := func(from *net.UDPAddr, tag string) func() error {
			return func() error {
				c, err := net.DialUDP("udp", from, net.UDPAddrFromAddrPort(netip.AddrPortFrom(ipA, vxlanPort)))
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write(vxlanPacket(vtepMAC("node-a"), netip.MustParseAddrPort("10.42.1.5:4000"), netip.MustParseAddrPort("10.42.0.0:9000"), tag))
				return err
			}
		}
		// The peer's last: once it is in, the others had their chance.
		if err := errors.Join(
			b.Do(send(&net.UDPAddr{IP: stranger.AsSlice()}, "stranger")),
			pod.Do(send(nil, "pod")),
			b.Do(send(&net.UDPAddr{IP: ipB.AsSlice()}, "peer")),
		); err != nil {
			t.Fatalf("send over %s: %v", over, err)
		}
		var got []string
		buf := make([]byte, 1500)
		for deadline := time.Now().Add(5 * time.Second); ; {
			if err := listener.SetReadDeadline(deadline); err != nil {
				t.Fatal(err)
			}
			n, err := listener.Read(buf)
			if err != nil {
				break
			}
			got = append(got, string(buf[:n]))
			if string(buf[:n]) == "peer" { // and what comes late
				deadline = time.Now().Add(300 * time.Millisecond)
			}
		}
		if !slices.Equal(got, []string{"peer"}) {
			t.Errorf("over %s: A took the packets of %q, want only the peer's", over, got)
		}
	}
}
