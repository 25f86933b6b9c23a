package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Device is the VXLAN device of backend vxlan.
const Device = "kelp.vxlan"

const (
	vni = 1
	// vxlanPort is flannel's rather than IANA's 4789, so firewalls opened
	// for k3s and flannel clusters let kelp's overlay through too.
	vxlanPort = 8472
	// vxlanOverhead is what encapsulation adds to a packet: outer IPv4
	// (20), UDP (8) and VXLAN (8) headers and the inner Ethernet header (14).
	vxlanOverhead = 50
	// protocol marks kelp's routes: routes on the uplink are shared with
	// the rest of the system, and their protocol is what tells kelp's
	// apart. 0x6b ("k") is not in iproute2's list of routing daemons.
	protocol netlink.RouteProtocol = 0x6b
)

// local is this node's end of the overlay.
type local struct {
	backend string
	ip      netip.Addr
	uplink  string // the interface name
	mac     net.HardwareAddr
	podCIDR netip.Prefix
}

// program makes the kernel route to peers and to nothing else kelp
// routed to before. Only what differs is changed, so existing flows are
// not disturbed. An entry that cannot be programmed does not stop the
// others; their errors are returned together.
func program(l local, peers []Peer) error {
	up, err := netlink.LinkByName(l.uplink)
	if err != nil {
		return fmt.Errorf("uplink %s: %w", l.uplink, err)
	}
	var errs []error
	var routes []netlink.Route
	switch l.backend {
	case BackendVXLAN:
		dev, err := ensureDevice(l, up)
		if err != nil {
			return err
		}
		if err := syncAddress(dev, l.podCIDR); err != nil {
			return err
		}
		errs = append(errs, syncFDB(dev, peers), syncNeighbours(dev, peers))
		for _, p := range peers {
			// The gateway is the peer's device, which has the network
			// address of its pod CIDR; it is on no subnet of this node,
			// hence onlink.
			routes = append(routes, netlink.Route{LinkIndex: dev.Attrs().Index, Dst: prefixNet(p.PodCIDR),
				Gw: p.PodCIDR.Addr().AsSlice(), Flags: int(netlink.FLAG_ONLINK), Protocol: protocol})
		}
	case BackendHostGW:
		// A node switched from vxlan: peers stopped sending to the device.
		if err := removeDevice(); err != nil {
			return err
		}
		for _, p := range peers {
			routes = append(routes, netlink.Route{LinkIndex: up.Attrs().Index, Dst: prefixNet(p.PodCIDR),
				Gw: p.IP.AsSlice(), Protocol: protocol})
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
		LinkAttrs: netlink.LinkAttrs{Name: Device, MTU: up.Attrs().MTU - vxlanOverhead, HardwareAddr: l.mac},
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

// syncAddress gives dev the network address of podCIDR, and no other
// address. Peers route to this node's pods through that address, and
// traffic from the node itself to other nodes' pods leaves with it, so the
// replies come back through the overlay.
func syncAddress(dev netlink.Link, podCIDR netip.Prefix) error {
	want := netip.PrefixFrom(podCIDR.Addr(), 32)
	addrs, err := retried(func() ([]netlink.Addr, error) { return netlink.AddrList(dev, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("addresses of %s: %w", Device, err)
	}
	have := false
	for _, a := range addrs {
		if netPrefix(a.IPNet) == want {
			have = true
			continue
		}
		if err := netlink.AddrDel(dev, &a); err != nil {
			return fmt.Errorf("delete address %s of %s: %w", a.IPNet, Device, err)
		}
	}
	if !have {
		if err := netlink.AddrAdd(dev, &netlink.Addr{IPNet: prefixNet(want)}); err != nil {
			return fmt.Errorf("add address %s to %s: %w", want, Device, err)
		}
	}
	return nil
}

// syncFDB makes the VXLAN device send the frames for each peer's VTEP MAC
// to the peer's IP.
func syncFDB(dev netlink.Link, peers []Peer) error {
	entry := func(mac net.HardwareAddr, ip net.IP) *netlink.Neigh {
		return &netlink.Neigh{LinkIndex: dev.Attrs().Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
			State: netlink.NUD_PERMANENT, HardwareAddr: mac, IP: ip}
	}
	want := map[string]Peer{}
	for _, p := range peers {
		want[p.MAC.String()+" "+p.IP.String()] = p
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
	for key, p := range want {
		log.WithField("entry", key).Debug("adding FDB entry")
		if err := netlink.NeighSet(entry(p.MAC, p.IP.AsSlice())); err != nil {
			errs = append(errs, fmt.Errorf("FDB entry for node %s (%s): %w", p.Name, key, err))
		}
	}
	return errors.Join(errs...)
}

// syncNeighbours tells the VXLAN device the VTEP MAC of each peer's device
// address: its ARP requests would go nowhere, as it has no FDB entry to
// flood them to.
func syncNeighbours(dev netlink.Link, peers []Peer) error {
	want := map[string]Peer{}
	for _, p := range peers {
		want[p.PodCIDR.Addr().String()+" "+p.MAC.String()] = p
	}
	have, err := retried(func() ([]netlink.Neigh, error) { return netlink.NeighList(dev.Attrs().Index, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("neighbours of %s: %w", Device, err)
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
	for key, p := range want {
		log.WithField("entry", key).Debug("adding neighbour")
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: dev.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, Type: unix.RTN_UNICAST, IP: p.PodCIDR.Addr().AsSlice(), HardwareAddr: p.MAC}); err != nil {
			errs = append(errs, fmt.Errorf("neighbour for node %s (%s): %w", p.Name, key, err))
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
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: protocol, Table: unix.RT_TABLE_MAIN},
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

// Remove deletes the VXLAN device and every route kelp made, so that no
// traffic to other nodes' pods goes where kelp sent it. Removing what is
// gone is no error.
func Remove() error {
	if err := removeDevice(); err != nil {
		return err
	}
	routes, err := kelpRoutes()
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range routes {
		if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route to %s: %w", r.Dst, err))
		}
	}
	return errors.Join(errs...)
}

// uplink returns the interface overlay traffic leaves by: cfg.Iface, or
// the one that has the node IP.
func uplink(cfg Config) (netlink.Link, error) {
	if cfg.Iface != "" {
		link, err := netlink.LinkByName(cfg.Iface)
		if err != nil {
			return nil, fmt.Errorf("interface %s: %w", cfg.Iface, err)
		}
		return link, nil
	}
	addrs, err := retried(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if netPrefix(a.IPNet).Addr() == cfg.NodeIP {
			link, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return nil, fmt.Errorf("interface of %s: %w", cfg.NodeIP, err)
			}
			return link, nil
		}
	}
	return nil, fmt.Errorf("no interface has the node IP %s: name the interface the nodes reach each other on", cfg.NodeIP)
}

// MTU returns the MTU to give pods: the uplink's, less the encapsulation
// overhead for backend vxlan.
func MTU(cfg Config) (int, error) {
	up, err := uplink(cfg)
	if err != nil {
		return 0, err
	}
	if cfg.Backend == BackendVXLAN {
		return up.Attrs().MTU - vxlanOverhead, nil
	}
	return up.Attrs().MTU, nil
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

// netPrefix converts n, which the kernel gives as IPv4, to a Prefix; the
// zero Prefix for nil (the default route).
func netPrefix(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	addr, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addr.Unmap(), ones)
}
