package overlay

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// netns is a network namespace with a thread in it that runs what it is
// given; it goes with the thread when the test ends.
type netns struct {
	fd    int
	funcs chan func()
}

func newNetns(t *testing.T) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	n := &netns{funcs: make(chan func())}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: Go retires the thread
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- fmt.Errorf("unshare: %w", err)
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ready <- err
			return
		}
		n.fd = fd
		ready <- nil
		for f := range n.funcs {
			f()
		}
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(n.funcs)
		unix.Close(n.fd)
	})
	return n
}

func (n *netns) do(f func() error) error {
	errs := make(chan error)
	n.funcs <- func() { errs <- f() }
	return <-errs
}

// dial connects to addr over TCP from the namespace and hangs up.
func (n *netns) dial(addr string) error {
	return n.do(func() error {
		c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// listen accepts (and closes) TCP connections on addr in the namespace
// until the test ends.
func (n *netns) listen(t *testing.T, addr string) {
	t.Helper()
	if err := n.do(func() error {
		l, err := net.Listen("tcp4", addr)
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
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
		if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: prefixNet(netip.MustParsePrefix(cidr))}); err != nil {
			return fmt.Errorf("address %s on %s: %w", cidr, name, err)
		}
		return nil
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

// addUplink gives the thread's namespace an uplink0 with addr, up, whose
// other end uplink1 is up too so that it has a carrier.
func addUplink(addr string) error {
	return inOrder(
		addLink(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "uplink1"}),
		addAddr("uplink0", addr),
		setUp("uplink0"),
		setUp("uplink1"),
	)
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
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
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
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT != 0 {
			s.Neighs = append(s.Neighs, fmt.Sprintf("%s lladdr %s dev %s", n.IP, n.HardwareAddr, names[n.LinkIndex]))
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
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return s, err
	}
	for _, a := range addrs {
		s.Addrs = append(s.Addrs, a.IPNet.String())
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

func (s state) String() string {
	return fmt.Sprintf("device: %s\naddrs:\n\t%s\nroutes:\n\t%s\nneighbours:\n\t%s\nFDB:\n\t%s", s.Device,
		strings.Join(s.Addrs, "\n\t"), strings.Join(s.Routes, "\n\t"), strings.Join(s.Neighs, "\n\t"), strings.Join(s.FDB, "\n\t"))
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

func peerOf(name, podCIDR, ip string, mac net.HardwareAddr) Peer {
	return Peer{Name: name, PodCIDR: netip.MustParsePrefix(podCIDR), IP: netip.MustParseAddr(ip), MAC: mac}
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

		a := local{backend: BackendVXLAN, ip: netip.MustParseAddr("10.99.0.2"), uplink: "uplink0", mac: macA, podCIDR: netip.MustParsePrefix("10.42.0.0/24")}
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
			FDB: []string{fmt.Sprintf("%s dst 10.99.0.3", macB), fmt.Sprintf("%s dst 10.99.0.4", macC)},
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
		// go, stale ones come, the device changes and goes down.
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
		a.podCIDR = netip.MustParsePrefix("10.42.10.0/24")
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
			FDB: []string{fmt.Sprintf("%s dst 10.99.0.13", macB), fmt.Sprintf("%s dst 10.99.0.4", macC2), fmt.Sprintf("%s dst 10.99.0.5", macD)},
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

		// The switch to host-gw takes the device and its entries away.
		hostGW := local{backend: BackendHostGW, ip: netip.MustParseAddr("10.99.0.2"), uplink: "uplink0", podCIDR: netip.MustParsePrefix("10.42.0.0/24")}
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
		if err := addUplink("10.99.0.2/24"); err != nil {
			t.Fatal(err)
		}
		up, err := netlink.LinkByName("uplink0")
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetMTU(up, 1400); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			backend, iface, ip string
			want               int
			err                string
		}{
			{backend: BackendVXLAN, ip: "10.99.0.2", want: 1350},
			{backend: BackendHostGW, ip: "10.99.0.2", want: 1400},
			{backend: BackendVXLAN, iface: "uplink1", ip: "10.99.0.2", want: 1450},
			{backend: BackendVXLAN, ip: "10.99.0.3", err: "no interface has the node IP 10.99.0.3"},
			{backend: BackendVXLAN, iface: "eth9", ip: "10.99.0.2", err: "interface eth9"},
		} {
			cfg := Config{Backend: tc.backend, Iface: tc.iface, NodeIP: netip.MustParseAddr(tc.ip)}
			got, err := MTU(cfg)
			if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("MTU(%+v) = %d, %v; want %d, %q", cfg, got, err, tc.want, tc.err)
			}
		}
	})
}

// TestPodToPod builds two nodes joined by a link, each with a pod behind
// its bridge as the CNI bridge plugin sets it up, and checks that the pods
// reach each other with each backend, and do not without kelp.
func TestPodToPod(t *testing.T) {
	type side struct {
		name, ip, podCIDR, bridgeIP, podIP string
		node, pod                          *netns
	}
	sides := []*side{
		{name: "node-a", ip: "10.99.0.2", podCIDR: "10.42.0.0/24", bridgeIP: "10.42.0.1", podIP: "10.42.0.5"},
		{name: "node-b", ip: "10.99.0.3", podCIDR: "10.42.1.0/24", bridgeIP: "10.42.1.1", podIP: "10.42.1.5"},
	}
	for _, s := range sides {
		s.node, s.pod = newNetns(t), newNetns(t)
	}
	a, b := sides[0], sides[1]
	if err := a.node.do(addLink(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "uplink0", PeerNamespace: netlink.NsFd(b.node.fd)})); err != nil {
		t.Fatal(err)
	}
	for _, s := range sides {
		err := s.node.do(func() error {
			return inOrder(
				func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) },
				addAddr("uplink0", s.ip+"/24"),
				setUp("uplink0"),
				addLink(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cni0"}}),
				addAddr("cni0", s.bridgeIP+"/24"),
				setUp("cni0"),
				func() error {
					br, err := netlink.LinkByName("cni0")
					if err != nil {
						return err
					}
					return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0", MasterIndex: br.Attrs().Index},
						PeerName: "eth0", PeerNamespace: netlink.NsFd(s.pod.fd)})
				},
				setUp("veth0"),
			)
		})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		err = s.pod.do(func() error {
			return inOrder(
				addAddr("eth0", s.podIP+"/24"),
				setUp("eth0"),
				setUp("lo"),
				func() error {
					return netlink.RouteAdd(&netlink.Route{Gw: net.ParseIP(s.bridgeIP)})
				},
			)
		})
		if err != nil {
			t.Fatalf("pod of %s: %v", s.name, err)
		}
	}
	b.pod.listen(t, b.podIP+":8080")
	podB := b.podIP + ":8080"

	// programAll programs each node for the other; with peers false, for
	// no peers.
	programAll := func(backend string, peers bool) {
		t.Helper()
		for i, s := range sides {
			o := sides[1-i]
			var ps []Peer
			if peers {
				ps = []Peer{{Name: o.name, PodCIDR: netip.MustParsePrefix(o.podCIDR), IP: netip.MustParseAddr(o.ip)}}
				if backend == BackendVXLAN {
					ps[0].MAC = vtepMAC(o.name)
				}
			}
			l := local{backend: backend, ip: netip.MustParseAddr(s.ip), uplink: "uplink0", mac: vtepMAC(s.name), podCIDR: netip.MustParsePrefix(s.podCIDR)}
			if err := s.node.do(func() error { return program(l, ps) }); err != nil {
				t.Fatalf("program %s for %s: %v", s.name, backend, err)
			}
		}
	}
	if err := a.pod.dial(podB); err == nil {
		t.Fatal("pod A reaches pod B before the overlay is programmed")
	}
	for _, backend := range []string{BackendVXLAN, BackendHostGW} {
		programAll(backend, true)
		if err := a.pod.dial(podB); err != nil {
			t.Errorf("%s: pod A cannot reach pod B: %v", backend, err)
		}
		// The node's own traffic to a remote pod comes back too: over
		// vxlan it leaves with the address of the device.
		if err := a.node.dial(podB); err != nil {
			t.Errorf("%s: node A cannot reach pod B: %v", backend, err)
		}
		programAll(backend, false)
		if err := a.pod.dial(podB); err == nil {
			t.Errorf("%s: pod A reaches pod B after its peer was removed", backend)
		}
	}
}
