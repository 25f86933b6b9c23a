package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/hostcheck"
)

// Device is the VXLAN device of backend vxlan.
const Device = "kelp.vxlan"

const (
	vni = 1
	// vxlanPort is flannel's rather than IANA's 4789, so firewalls opened
	// for k3s and flannel clusters let kelp's overlay through too.
	vxlanPort = 8472
	// vxlanOverhead4 and vxlanOverhead6 are what encapsulation adds to
	// a packet: the outer IPv4 (20) or IPv6 (40) header, UDP (8) and
	// VXLAN (8) headers and the inner Ethernet header (14).
	vxlanOverhead4 = 50
	vxlanOverhead6 = 70
	// protocol marks kelp's routes: routes on the uplink are shared with
	// the rest of the system, and their protocol is what tells kelp's
	// apart. 0x6b ("k") is not in iproute2's list of routing daemons.
	protocol netlink.RouteProtocol = 0x6b
)

// overhead is what VXLAN over f adds to a packet.
func overhead(f family) int {
	if f == ipv6 {
		return vxlanOverhead6
	}
	return vxlanOverhead4
}

// local is this node's end of the overlay.
type local struct {
	backend string
	// ip is the node IP the VXLAN device runs over.
	ip netip.Addr
	// uplinks are the interface names overlay traffic of each family
	// leaves by: VXLAN's by that of ip's family, host-gw's by that of the
	// pods' family.
	uplinks  map[family]string
	mac      net.HardwareAddr
	podCIDRs []netip.Prefix
}

// uplink returns the link of l that traffic of family f leaves by.
func (l local) uplink(f family) (netlink.Link, error) {
	name, ok := l.uplinks[f]
	if !ok {
		return nil, fmt.Errorf("no %s node IP: nothing leads to %s peers", f, f)
	}
	link, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("uplink %s: %w", name, err)
	}
	return link, nil
}

// program makes the kernel route to peers and to nothing else kelp
// routed to before, and with vxlan take VXLAN packets from peers only. Only what differs is changed, so existing flows are
// not disturbed. An entry that cannot be programmed does not stop the
// others; their errors are returned together.
//
// Both families are synced whatever the cluster has, so what kelp
// programmed of a family the cluster dropped goes like a stale peer.
func program(l local, peers []Peer) error {
	var errs []error
	var routes []netlink.Route
	switch l.backend {
	case BackendVXLAN:
		// First, and whatever fails after: the peers VXLAN is taken
		// from follow the peers even when the device cannot.
		errs = append(errs, guard(peers))
		up, err := l.uplink(familyOf(l.ip))
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		dev, err := ensureDevice(l, up)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		if err := syncAddresses(dev, l.podCIDRs); err != nil {
			return errors.Join(append(errs, err)...)
		}
		errs = append(errs, syncFDB(dev, familyOf(l.ip), peers), syncNeighbours(dev, peers))
		for _, p := range peers {
			for _, cidr := range p.PodCIDRs {
				// The gateway is the peer's device, which has the
				// network address of its pod CIDR; it is on no subnet
				// of this node, hence onlink.
				routes = append(routes, netlink.Route{LinkIndex: dev.Attrs().Index, Dst: prefixNet(cidr),
					Gw: cidr.Addr().AsSlice(), Flags: int(netlink.FLAG_ONLINK), Protocol: protocol})
			}
		}
	case BackendHostGW:
		// A node switched from vxlan: peers stopped sending to the device.
		if err := removeDevice(); err != nil {
			return err
		}
		errs = append(errs, unguard())
		for _, p := range peers {
			for _, cidr := range p.PodCIDRs {
				f := familyOf(cidr.Addr())
				up, err := l.uplink(f)
				if err != nil {
					errs = append(errs, fmt.Errorf("route to %s of node %s: %w", cidr, p.Name, err))
					continue
				}
				routes = append(routes, netlink.Route{LinkIndex: up.Attrs().Index, Dst: prefixNet(cidr),
					Gw: nodeIP(p.IPs, f).AsSlice(), Protocol: protocol})
			}
		}
	default:
		return fmt.Errorf("backend %q programs nothing", l.backend)
	}
	errs = append(errs, syncRoutes(routes))
	return errors.Join(errs...)
}

// ensureDevice returns the VXLAN device, up and with the settings of l,
// creating it or, when its tunnel settings are wrong, re-creating it.
func ensureDevice(l local, up netlink.Link) (netlink.Link, error) {
	want := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: Device, MTU: up.Attrs().MTU - overhead(familyOf(l.ip)), HardwareAddr: l.mac},
		VxlanId:   vni, VtepDevIndex: up.Attrs().Index, SrcAddr: l.ip.AsSlice(), Port: vxlanPort,
		// Peers are known from the API: the kernel must neither learn
		// nor flood.
		Learning: false,
	}
	link, err := netlink.LinkByName(Device)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
	case err != nil:
		return nil, fmt.Errorf("%s: %w", Device, err)
	case sameTunnel(link, want):
		return link, fixDevice(link, want)
	default:
		log.WithField("device", Device).Info("re-creating the VXLAN device: its settings changed")
		if err := netlink.LinkDel(link); err != nil {
			return nil, fmt.Errorf("delete %s: %w", Device, err)
		}
	}
	if err := netlink.LinkAdd(want); err != nil {
		return nil, fmt.Errorf("create VXLAN device %s: %w (is vxlan in the kernel? see `kelp check-config`)", Device, err)
	}
	log.WithFields(logrus.Fields{"device": Device, "mac": l.mac, "local": l.ip, "uplink": up.Attrs().Name}).Info("created VXLAN device")
	link, err = netlink.LinkByName(Device)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Device, err)
	}
	return link, fixDevice(link, want)
}

// sameTunnel says whether link carries the tunnel want describes; its MTU
// and MAC can be changed in place.
func sameTunnel(link netlink.Link, want *netlink.Vxlan) bool {
	v, ok := link.(*netlink.Vxlan)
	return ok && v.VxlanId == want.VxlanId && v.VtepDevIndex == want.VtepDevIndex && v.SrcAddr.Equal(want.SrcAddr) &&
		v.Port == want.Port && v.Learning == want.Learning
}

// fixDevice sets MTU and MAC of link to those of want, and sets it up. The
// MTU follows the uplink's, which may change while kelp runs.
func fixDevice(link netlink.Link, want *netlink.Vxlan) error {
	if link.Attrs().MTU != want.MTU {
		if err := netlink.LinkSetMTU(link, want.MTU); err != nil {
			return fmt.Errorf("set MTU of %s to %d: %w", Device, want.MTU, err)
		}
	}
	if !bytes.Equal(link.Attrs().HardwareAddr, want.HardwareAddr) {
		if err := netlink.LinkSetHardwareAddr(link, want.HardwareAddr); err != nil {
			return fmt.Errorf("set MAC of %s: %w", Device, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", Device, err)
		}
	}
	return nil
}

// syncAddresses gives dev the network address of each of podCIDRs, and no
// other address but the kernel's IPv6 link-local one. Peers route to this
// node's pods through those addresses, and traffic from the node itself to
// other nodes' pods leaves with them, so the replies come back through the
// overlay.
func syncAddresses(dev netlink.Link, podCIDRs []netip.Prefix) error {
	want := map[netip.Prefix]bool{}
	for _, cidr := range podCIDRs {
		want[netip.PrefixFrom(cidr.Addr(), cidr.Addr().BitLen())] = true
	}
	addrs, err := retried(func() ([]netlink.Addr, error) { return netlink.AddrList(dev, netlink.FAMILY_ALL) })
	if err != nil {
		return fmt.Errorf("addresses of %s: %w", Device, err)
	}
	for _, a := range addrs {
		have := netPrefix(a.IPNet)
		if have.Addr().IsLinkLocalUnicast() {
			continue
		}
		if want[have] {
			delete(want, have)
			continue
		}
		if err := netlink.AddrDel(dev, &a); err != nil {
			return fmt.Errorf("delete address %s of %s: %w", a.IPNet, Device, err)
		}
	}
	for addr := range want {
		// No duplicate address detection: the address is this node's
		// by its pod CIDR, and it would be unusable for a second or
		// more while the kernel looked.
		if err := netlink.AddrAdd(dev, &netlink.Addr{IPNet: prefixNet(addr), Flags: unix.IFA_F_NODAD}); err != nil {
			if addr.Addr().Is6() {
				return fmt.Errorf("add address %s to %s: %w (is IPv6 disabled? see sysctl net.ipv6.conf.all.disable_ipv6 and the kernel's ipv6.disable)", addr, Device, err)
			}
			return fmt.Errorf("add address %s to %s: %w", addr, Device, err)
		}
	}
	return nil
}

// syncFDB makes the VXLAN device send the frames for each peer's VTEP MAC
// to the peer's node IP of family f, the device's.
func syncFDB(dev netlink.Link, f family, peers []Peer) error {
	entry := func(mac net.HardwareAddr, ip net.IP) *netlink.Neigh {
		return &netlink.Neigh{LinkIndex: dev.Attrs().Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
			State: netlink.NUD_PERMANENT, HardwareAddr: mac, IP: ip}
	}
	type fdbEntry struct {
		name string
		mac  net.HardwareAddr
		ip   netip.Addr
	}
	want := map[string]fdbEntry{}
	for _, p := range peers {
		ip := nodeIP(p.IPs, f)
		want[p.MAC.String()+" "+ip.String()] = fdbEntry{p.Name, p.MAC, ip}
	}
	have, err := retried(func() ([]netlink.Neigh, error) { return netlink.NeighList(dev.Attrs().Index, unix.AF_BRIDGE) })
	if err != nil {
		return fmt.Errorf("FDB of %s: %w", Device, err)
	}
	var errs []error
	for _, n := range have {
		key := n.HardwareAddr.String() + " " + n.IP.String()
		if _, ok := want[key]; ok {
			delete(want, key)
			continue
		}
		log.WithField("entry", key).Debug("deleting FDB entry")
		if err := netlink.NeighDel(entry(n.HardwareAddr, n.IP)); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete FDB entry %s: %w", key, err))
		}
	}
	for key, e := range want {
		log.WithField("entry", key).Debug("adding FDB entry")
		if err := netlink.NeighSet(entry(e.mac, e.ip.AsSlice())); err != nil {
			errs = append(errs, fmt.Errorf("FDB entry for node %s (%s): %w", e.name, key, err))
		}
	}
	return errors.Join(errs...)
}

// syncNeighbours tells the VXLAN device the VTEP MAC of each peer's device
// addresses: its ARP and neighbour solicitations would go nowhere, as it
// has no FDB entry to flood them to.
func syncNeighbours(dev netlink.Link, peers []Peer) error {
	type neighbour struct {
		name string
		ip   netip.Addr
		mac  net.HardwareAddr
	}
	want := map[string]neighbour{}
	for _, p := range peers {
		for _, cidr := range p.PodCIDRs {
			want[cidr.Addr().String()+" "+p.MAC.String()] = neighbour{p.Name, cidr.Addr(), p.MAC}
		}
	}
	var have []netlink.Neigh
	for _, f := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		neighs, err := retried(func() ([]netlink.Neigh, error) { return netlink.NeighList(dev.Attrs().Index, f) })
		if err != nil {
			return fmt.Errorf("neighbours of %s: %w", Device, err)
		}
		have = append(have, neighs...)
	}
	var errs []error
	for _, n := range have {
		if n.State&netlink.NUD_PERMANENT == 0 {
			continue // the kernel's own, from failed lookups; they age out
		}
		key := n.IP.String() + " " + n.HardwareAddr.String()
		if _, ok := want[key]; ok {
			delete(want, key)
			continue
		}
		log.WithField("entry", key).Debug("deleting neighbour")
		if err := netlink.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete neighbour %s: %w", key, err))
		}
	}
	for key, n := range want {
		log.WithField("entry", key).Debug("adding neighbour")
		fam := netlink.FAMILY_V4
		if n.ip.Is6() {
			fam = netlink.FAMILY_V6
		}
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: dev.Attrs().Index, Family: fam,
			State: netlink.NUD_PERMANENT, Type: unix.RTN_UNICAST, IP: n.ip.AsSlice(), HardwareAddr: n.mac}); err != nil {
			errs = append(errs, fmt.Errorf("neighbour for node %s (%s): %w", n.name, key, err))
		}
	}
	return errors.Join(errs...)
}

// syncRoutes makes kelp's routes the ones in want, one per destination.
// A route to a destination that changed is replaced, not deleted and
// added, so that no packet finds no route.
func syncRoutes(want []netlink.Route) error {
	byDst := map[netip.Prefix]netlink.Route{}
	for _, r := range want {
		byDst[netPrefix(r.Dst)] = r
	}
	have, err := kelpRoutes()
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range have {
		dst := netPrefix(r.Dst)
		w, ok := byDst[dst]
		switch {
		case ok && sameRoute(r, w):
			delete(byDst, dst)
		case !ok:
			log.WithField("route", r).Debug("deleting route")
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("delete route to %s: %w", dst, err))
			}
		}
	}
	for dst, r := range byDst {
		log.WithField("route", r).Debug("adding route")
		// Replace, not add: kelp's own route of another backend, or one
		// left by a CNI used before, may already lead there.
		if err := netlink.RouteReplace(&r); err != nil {
			errs = append(errs, fmt.Errorf("route to %s via %s: %w", dst, r.Gw, err))
		}
	}
	return errors.Join(errs...)
}

func sameRoute(a, b netlink.Route) bool {
	const onlink = int(netlink.FLAG_ONLINK)
	return a.LinkIndex == b.LinkIndex && a.Gw.Equal(b.Gw) && a.Flags&onlink == b.Flags&onlink
}

// kelpRoutes lists the routes kelp made, on any device.
func kelpRoutes() ([]netlink.Route, error) {
	routes, err := retried(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: protocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	return routes, nil
}

// removeDevice deletes the VXLAN device, and with it its address, routes,
// neighbours and FDB entries.
func removeDevice() error {
	link, err := netlink.LinkByName(Device)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", Device, err)
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("delete %s: %w", Device, err)
	}
	log.WithField("device", Device).Info("deleted VXLAN device")
	return nil
}

// Remove deletes the VXLAN device, its table and every route kelp made, so
// that no traffic to other nodes' pods goes where kelp sent it. Removing
// what is gone is no error.
func Remove() error {
	if err := removeDevice(); err != nil {
		return err
	}
	routes, err := kelpRoutes()
	if err != nil {
		return err
	}
	errs := []error{unguard()}
	for _, r := range routes {
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route to %s: %w", r.Dst, err))
		}
	}
	return errors.Join(errs...)
}

// uplinks returns the interfaces overlay traffic leaves by, by family:
// for host-gw one for each family of the cluster, else the one of the node
// IP VXLAN runs over. Each is cfg.Iface, or the one that has the node IP of
// its family.
func uplinks(cfg Config) (map[family]netlink.Link, error) {
	ips := []netip.Addr{cfg.underlay()}
	if cfg.Backend == BackendHostGW {
		ips = nil
		for _, cidr := range cfg.ClusterCIDRs {
			ips = append(ips, nodeIP(cfg.NodeIPs, familyOf(cidr.Addr())))
		}
	}
	out := map[family]netlink.Link{}
	for _, ip := range ips {
		up, err := uplink(cfg.Iface, ip)
		if err != nil {
			return nil, err
		}
		out[familyOf(ip)] = up
	}
	return out, nil
}

// uplink returns iface or, if that is "", the interface that has ip.
func uplink(iface string, ip netip.Addr) (netlink.Link, error) {
	if iface != "" {
		link, err := netlink.LinkByName(iface)
		if err != nil {
			return nil, fmt.Errorf("interface %s: %w", iface, err)
		}
		return link, nil
	}
	addrs, err := retried(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if netPrefix(a.IPNet).Addr() == ip {
			link, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return nil, fmt.Errorf("interface of %s: %w", ip, err)
			}
			return link, nil
		}
	}
	return nil, fmt.Errorf("no interface has the node IP %s: name the interface the nodes reach each other on", ip)
}

// MTU returns the MTU to give pods: the uplink's, less the encapsulation
// overhead of its family for backend vxlan; for host-gw the least of the
// uplinks', since a pod has one MTU for both families.
func MTU(cfg Config) (int, error) {
	ups, err := uplinks(cfg)
	if err != nil {
		return 0, err
	}
	if f := familyOf(cfg.underlay()); cfg.Backend == BackendVXLAN {
		return ups[f].Attrs().MTU - overhead(f), nil
	}
	mtu := 0
	for _, up := range ups {
		if mtu == 0 || up.Attrs().MTU < mtu {
			mtu = up.Attrs().MTU
		}
	}
	return mtu, nil
}

// ensureIPv6 makes sure the node can carry IPv6 pod traffic on dev: it
// refuses when IPv6 is off on the node, and turns it on for dev when dev
// was made while it was off (an interface takes its setting from
// net.ipv6.conf.default when it is made).
func ensureIPv6(dev string) error {
	if !hostcheck.KernelHasIPv6() {
		return errors.New("the kernel has IPv6 off (ipv6.disable=1 on its command line): remove that and reboot, or give the cluster no IPv6 --cluster-cidr")
	}
	for _, iface := range []string{"all", "default"} {
		isOff, err := hostcheck.IPv6Off(iface)
		if err != nil {
			return err
		}
		if isOff {
			return fmt.Errorf("IPv6 is off on this node (sysctl net.ipv6.conf.%s.disable_ipv6=1): turn it on (sysctl -w net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.default.disable_ipv6=0) and start kelp again, or give the cluster no IPv6 --cluster-cidr", iface)
		}
	}
	isOff, err := hostcheck.IPv6Off(dev)
	if err != nil || !isOff {
		return err
	}
	if err := os.WriteFile(filepath.Join(hostcheck.IPv6Conf, dev, "disable_ipv6"), []byte("0"), 0o644); err != nil {
		return fmt.Errorf("turn IPv6 on for %s: %w", dev, err)
	}
	log.WithField("device", dev).Info("turned IPv6 on for the VXLAN device, made while it was off on the node")
	return nil
}

// retried calls list again when the kernel says the dump was interrupted
// by a change, which leaves it inconsistent.
func retried[T any](list func() ([]T, error)) ([]T, error) {
	for range 3 {
		out, err := list()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	return list()
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// netPrefix converts n, whose IPv4 addresses the kernel may give in their
// 16-byte form, to a Prefix; the zero Prefix for nil (the default route).
func netPrefix(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	addr, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addr.Unmap(), ones)
}
