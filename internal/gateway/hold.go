package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/config"
)

// Announcements: how many times a node that takes an address tells its
// network, and how far apart, so that a lost packet does not leave
// clients' caches on the node that held it before.
const (
	announceCount    = 3
	announceInterval = time.Second
)

// Probes: before a node adds an IPv4 address it asks its network whether
// another machine has it (RFC 5227's ARP probe), probeCount times
// probeInterval apart, listening until probeWait after the last; an IPv6
// address is added with the kernel's duplicate address detection, waited
// for up to dadWait. An address found in use is not held and is reported
// (InUseAnnotation) for inUseFor, without asking again while it is: long
// enough for the controller to give it to every other node that may hold
// it, short enough that an address freed on the network comes back.
const (
	probeCount    = 3
	probeInterval = 200 * time.Millisecond
	probeWait     = 500 * time.Millisecond
	dadWait       = 5 * time.Second
	inUseFor      = 2 * time.Minute
	// handOver: an address found in use is asked about once more after
	// this long, for the node that held it before, which lets go as soon
	// as it reads the same Config, may still have answered.
	handOver = 2 * time.Second
)

// errInUse: another machine answers for the address on its network.
var errInUse = errors.New("in use on the network")

// holder puts the Gateway addresses this node is given on the interfaces
// of their networks, announces them there, and takes off those it is no
// longer given. It records what it holds in a file before it adds an
// address, so that what a crash leaves is known and only kelp's addresses
// are ever removed. It is used from one goroutine.
type holder struct {
	file string
	node string
	held map[netip.Addr]*heldAddr
	// problems are the last error logged for each address this node is
	// given but cannot hold, so that each is logged once.
	problems map[netip.Addr]string
	// inUse are the addresses this node found in use by another machine
	// on their network.
	inUse map[netip.Addr]finding
}

// finding is when an address was found in use, and how.
type finding struct {
	at  time.Time
	err error
}

type heldAddr struct {
	iface string
	// stop ends the address's announcements; nil once they ended or for
	// an address only known from the record.
	stop func()
}

// holdRecord is the file of the addresses a node holds.
type holdRecord struct {
	Addresses []recordedAddr `json:"addresses"`
}

type recordedAddr struct {
	Address   string `json:"address"`
	Interface string `json:"interface"`
}

// loadHolder reads what the node held when it last wrote file. A file
// that is missing, empty or not valid (a crash cannot cut a write short:
// it is written whole, but a disk can lose it) is taken as nothing held.
func loadHolder(file, node string) (*holder, error) {
	h := &holder{file: file, node: node, held: map[netip.Addr]*heldAddr{}, problems: map[netip.Addr]string{}, inUse: map[netip.Addr]finding{}}
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return h, nil
	}
	if err != nil {
		return h, fmt.Errorf("read the Gateway addresses this node held: %w", err)
	}
	var rec holdRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		log.WithError(err).Warnf("%s is not valid: taken as no Gateway address held", file)
		return h, nil
	}
	for _, r := range rec.Addresses {
		if a, err := netip.ParseAddr(r.Address); err == nil && r.Interface != "" {
			h.held[a.Unmap()] = &heldAddr{iface: r.Interface}
		}
	}
	return h, nil
}

// ReleaseRecorded takes off every Gateway address a node recorded in file
// as held, and removes the file: for kelp killall, once the node stopped.
func ReleaseRecorded(file string) error {
	h, err := loadHolder(file, "")
	if err != nil {
		return err
	}
	if err := h.releaseAll(); err != nil {
		// The file keeps what is left, for the next try.
		return err
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// sync holds the addresses of addrs (address to node) given to this node
// and releases the others. An address that cannot be held is logged once,
// saying why, and tried again at the next sync.
func (h *holder) sync(addrs map[netip.Addr]string) {
	for a := range h.held {
		if addrs[a] != h.node {
			if err := h.release(a); err != nil {
				log.WithError(err).Errorf("cannot release the Gateway address %s; trying again", a)
			}
		}
	}
	for a := range h.problems {
		if addrs[a] != h.node {
			delete(h.problems, a)
		}
	}
	var have []netlink.Addr
	for a, node := range addrs {
		if node != h.node {
			continue
		}
		if have == nil {
			// Listed once for all the addresses this node holds.
			var err error
			if have, err = netlink.AddrList(nil, netlink.FAMILY_ALL); err != nil {
				log.WithError(err).Error("cannot list the node's addresses to hold its Gateway addresses; trying again")
				return
			}
		}
		if err := h.hold(a, have); err != nil {
			if h.problems[a] != err.Error() {
				log.WithError(err).Errorf("cannot hold the Gateway address %s on this node; trying again", a)
				h.problems[a] = err.Error()
			}
			continue
		}
		delete(h.problems, a)
	}
}

// hold makes sure a is on the interface of its network, adding and
// announcing it if it is not (again, should something have taken it off).
// addrs are the node's addresses.
func (h *holder) hold(a netip.Addr, addrs []netlink.Addr) error {
	var link netlink.Link
	var err error
	for _, x := range addrs {
		ip, _ := netip.AddrFromSlice(x.IP)
		ones, bits := x.Mask.Size()
		if ip.Unmap() == a {
			if held := h.held[a]; held != nil && ones == bits && linkName(x.LinkIndex) == held.iface {
				if x.Flags&unix.IFA_F_DADFAILED != 0 {
					// Found in use after it was added: its interface had
					// no carrier then, and the kernel checked it later.
					err := h.foundInUse(a, fmt.Errorf("%w of %s: another machine has it (IPv6 duplicate address detection)", errInUse, held.iface))
					return errors.Join(err, h.release(a))
				}
				return nil
			}
			return fmt.Errorf("%s is already on interface %s, and kelp did not put it there: take it off, or take it out of --gateway-address-range", x.IPNet, linkName(x.LinkIndex))
		}
		if link == nil && ones < bits && x.IPNet.Contains(a.AsSlice()) {
			if link, err = netlink.LinkByIndex(x.LinkIndex); err != nil {
				return fmt.Errorf("interface of %s: %w", x.IPNet, err)
			}
		}
	}
	if link == nil {
		return fmt.Errorf("--gateway-address-range must be on the nodes' network; node %s has no interface on the network of %s", h.node, a)
	}
	if held := h.held[a]; held != nil {
		// Taken off by someone else, or recorded on another interface.
		if err := h.release(a); err != nil {
			return err
		}
	}
	iface := link.Attrs().Name
	if found, ok := h.inUse[a]; ok && time.Since(found.at) < inUseFor {
		return found.err
	}
	delete(h.inUse, a)
	if a.Is4() {
		err := probe(link, a)
		if errors.Is(err, errInUse) {
			time.Sleep(handOver)
			err = probe(link, a)
		}
		if err != nil {
			return h.foundInUse(a, err)
		}
	}
	h.held[a] = &heldAddr{iface: iface}
	if err := h.write(); err != nil {
		delete(h.held, a)
		return err
	}
	if err := netlink.AddrAdd(link, hostAddr(a)); err != nil {
		delete(h.held, a)
		if werr := h.write(); werr != nil {
			log.WithError(werr).Warn("cannot record the Gateway addresses this node holds")
		}
		return fmt.Errorf("add %s to %s: %w", a, iface, err)
	}
	if a.Is6() {
		err := awaitDAD(link, a)
		if errors.Is(err, errInUse) {
			// Added again: the kernel checks an address once.
			time.Sleep(handOver)
			if err = netlink.AddrDel(link, hostAddr(a)); err == nil {
				if err = netlink.AddrAdd(link, hostAddr(a)); err == nil {
					err = awaitDAD(link, a)
				}
			}
		}
		if err != nil {
			return errors.Join(h.foundInUse(a, err), h.release(a))
		}
	}
	log.WithField("interface", iface).Infof("holding the Gateway address %s", a)
	stop, err := announce(link, a)
	if err != nil {
		log.WithError(err).Warnf("cannot announce the Gateway address %s on %s: clients may reach the node that held it before until their neighbour caches expire", a, iface)
	}
	h.held[a].stop = stop
	return nil
}

// release takes a off its interface and out of the record. An address
// that is already gone, or whose interface is, is released.
func (h *holder) release(a netip.Addr) error {
	held := h.held[a]
	if held.stop != nil {
		held.stop()
		held.stop = nil
	}
	link, err := netlink.LinkByName(held.iface)
	if err == nil {
		err = netlink.AddrDel(link, hostAddr(a))
	}
	if err != nil && !errors.As(err, &netlink.LinkNotFoundError{}) && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("remove %s from %s: %w", a, held.iface, err)
	}
	delete(h.held, a)
	log.WithField("interface", held.iface).Infof("released the Gateway address %s", a)
	return h.write()
}

// foundInUse records a as in use when err says so (errInUse), and
// returns err as hold reports it.
func (h *holder) foundInUse(a netip.Addr, err error) error {
	if !errors.Is(err, errInUse) {
		return fmt.Errorf("%s: %w", a, err)
	}
	err = fmt.Errorf("%s: %w: this node does not hold it, and reports it to the server (%s) for %s; free it, or take it out of --gateway-address-range", a, err, InUseAnnotation, inUseFor)
	h.inUse[a] = finding{at: time.Now(), err: err}
	return err
}

// inUseReport are the addresses this node found in use in the last
// inUseFor, as InUseAnnotation says them.
func (h *holder) inUseReport() string {
	var out []string
	for _, a := range slices.SortedFunc(maps.Keys(h.inUse), netip.Addr.Compare) {
		if time.Since(h.inUse[a].at) < inUseFor {
			out = append(out, a.String())
		} else {
			delete(h.inUse, a)
		}
	}
	return strings.Join(out, ",")
}

// probe says whether another machine answers for a on the network of
// link: an ARP probe (RFC 5227) from sender address 0.0.0.0, so that no
// neighbour's cache learns anything of it. Any ARP packet from another
// hardware address that says a is its own, or probes for a too, is an
// answer. A link without link layer addresses is not asked.
func probe(link netlink.Link, a netip.Addr) error {
	ifi, err := net.InterfaceByIndex(link.Attrs().Index)
	if err != nil {
		return err
	}
	if len(ifi.HardwareAddr) == 0 {
		return nil
	}
	c, err := arp.Dial(ifi)
	if err != nil {
		return fmt.Errorf("ARP probe on %s: %w", ifi.Name, err)
	}
	defer c.Close()
	req, err := arp.NewPacket(arp.OperationRequest, ifi.HardwareAddr, netip.IPv4Unspecified(), make(net.HardwareAddr, len(ifi.HardwareAddr)), a)
	if err != nil {
		return err
	}
	for i := range probeCount {
		if err := c.WriteTo(req, ethernet.Broadcast); err != nil {
			return fmt.Errorf("ARP probe on %s: %w", ifi.Name, err)
		}
		wait := probeInterval
		if i == probeCount-1 {
			wait = probeWait
		}
		if err := c.SetReadDeadline(time.Now().Add(wait)); err != nil {
			return err
		}
		for {
			p, _, err := c.Read()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if err != nil {
				return fmt.Errorf("ARP probe on %s: %w", ifi.Name, err)
			}
			if bytes.Equal(p.SenderHardwareAddr, ifi.HardwareAddr) {
				continue
			}
			if p.SenderIP == a || (p.TargetIP == a && p.SenderIP.IsUnspecified() && p.Operation == arp.OperationRequest) {
				return fmt.Errorf("%w of %s: %s answers for it over ARP", errInUse, ifi.Name, p.SenderHardwareAddr)
			}
		}
	}
	return nil
}

// awaitDAD waits until the kernel's duplicate address detection of a on
// link ends: errInUse when another machine has a. An address still
// tentative after dadWait (a link without carrier, where DAD waits for
// one) is left to the kernel: hold looks at it again at each sync.
func awaitDAD(link netlink.Link, a netip.Addr) error {
	for deadline := time.Now().Add(dadWait); ; time.Sleep(50 * time.Millisecond) {
		list, err := netlink.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(list, func(x netlink.Addr) bool { ip, _ := netip.AddrFromSlice(x.IP); return ip == a })
		switch {
		case i < 0:
			return fmt.Errorf("%s went from %s while the kernel checked it", a, link.Attrs().Name)
		case list[i].Flags&unix.IFA_F_DADFAILED != 0:
			return fmt.Errorf("%w of %s: another machine has it (IPv6 duplicate address detection)", errInUse, link.Attrs().Name)
		case list[i].Flags&unix.IFA_F_TENTATIVE == 0 || time.Now().After(deadline):
			return nil
		}
	}
}

// releaseAll releases every address held, as the node stops.
func (h *holder) releaseAll() error {
	var errs []error
	for a := range h.held {
		errs = append(errs, h.release(a))
	}
	return errors.Join(errs...)
}

func (h *holder) write() error {
	rec := holdRecord{Addresses: []recordedAddr{}}
	for _, a := range slices.SortedFunc(maps.Keys(h.held), netip.Addr.Compare) {
		rec.Addresses = append(rec.Addresses, recordedAddr{Address: a.String(), Interface: h.held[a].iface})
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(h.file, data, 0o600)
}

// networks are the networks of the node's interfaces as the annotation
// NetworksAnnotation says them: the prefixes of their unicast addresses,
// not the host addresses kelp holds.
func networks() string {
	var nets []netip.Prefix
	for _, n := range config.Networks() {
		if n.Bits() < n.Addr().BitLen() && n.Addr().IsGlobalUnicast() {
			nets = append(nets, n.Masked())
		}
	}
	slices.SortFunc(nets, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	s := make([]string, 0, len(nets))
	for _, p := range slices.Compact(nets) {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

// hostAddr is a alone, as kelp adds it. An IPv6 one goes through the
// kernel's duplicate address detection (the controller gives it to one
// node, but another machine on the network may have it: see awaitDAD),
// and is deprecated, so that the node's own connections do not take it
// as their source: it may move to another node.
func hostAddr(a netip.Addr) *netlink.Addr {
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
	if a.Is6() {
		addr.ValidLft = math.MaxUint32 // forever
		addr.PreferedLft = 0
	}
	return addr
}

func linkName(index int) string {
	link, err := netlink.LinkByIndex(index)
	if err != nil {
		return fmt.Sprintf("#%d", index)
	}
	return link.Attrs().Name
}

// announce tells the network of link that a is now at link's hardware
// address: gratuitous ARP for IPv4, an unsolicited neighbour advertisement
// that overrides for IPv6, so that clients' caches move to this node at
// once after it took a over from another. The first goes out before it
// returns, the rest in the background until stop. The socket is opened
// here, in the caller's network namespace.
func announce(link netlink.Link, a netip.Addr) (stop func(), err error) {
	ifi, err := net.InterfaceByIndex(link.Attrs().Index)
	if err != nil {
		return nil, err
	}
	if len(ifi.HardwareAddr) == 0 {
		// No link layer addresses on this network: nothing to tell.
		return nil, nil
	}
	var send func() error
	var closer func() error
	if a.Is4() {
		c, err := arp.Dial(ifi)
		if err != nil {
			return nil, fmt.Errorf("ARP on %s: %w", ifi.Name, err)
		}
		send = func() error {
			// Both a request and a reply: hosts differ in which they
			// take as news.
			for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
				p, err := arp.NewPacket(op, ifi.HardwareAddr, a, ethernet.Broadcast, a)
				if err != nil {
					return err
				}
				if err := c.WriteTo(p, ethernet.Broadcast); err != nil {
					return err
				}
			}
			return nil
		}
		closer = c.Close
	} else {
		c, _, err := ndp.Listen(ifi, ndp.Addr(a.String()))
		if err != nil {
			return nil, fmt.Errorf("NDP on %s: %w", ifi.Name, err)
		}
		na := &ndp.NeighborAdvertisement{Override: true, TargetAddress: a, Options: []ndp.Option{
			&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ifi.HardwareAddr},
		}}
		send = func() error { return c.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes()) }
		closer = c.Close
	}
	if err := send(); err != nil {
		_ = closer()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		defer closer()
		t := time.NewTicker(announceInterval)
		defer t.Stop()
		for range announceCount - 1 {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := send(); err != nil {
				log.WithError(err).Debugf("announce %s on %s", a, ifi.Name)
			}
		}
	})
	return func() { cancel(); wg.Wait() }, nil
}
