package proxy

import (
	"errors"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// staleFlow names the UDP conntrack entries of a Service port that still
// lead to an endpoint it no longer has. UDP has no connection to break:
// without forgetting them, a client that keeps its source port keeps
// sending to the gone endpoint.
type staleFlow struct {
	port     Port // the Service port as it was
	endpoint netip.Addr
}

// staleUDPFlows compares the ports programmed before with the ports
// programmed now.
func staleUDPFlows(before, now []Port) []staleFlow {
	current := map[portKey]map[netip.Addr]bool{}
	for _, p := range now {
		if p.Protocol != unix.IPPROTO_UDP {
			continue
		}
		eps := map[netip.Addr]bool{}
		for _, ep := range p.Endpoints {
			eps[ep.Addr()] = true
		}
		current[key(p)] = eps
	}
	var stale []staleFlow
	for _, p := range before {
		if p.Protocol != unix.IPPROTO_UDP {
			continue
		}
		for _, ep := range p.Endpoints {
			if !current[key(p)][ep.Addr()] {
				stale = append(stale, staleFlow{port: p, endpoint: ep.Addr()})
			}
		}
	}
	return stale
}

// portKey identifies a Service port or a hostPort across syncs: a
// dual-stack pod's hostPort is one of each family.
type portKey struct {
	ip       netip.Addr
	protocol uint8
	port     uint16
	nodePort uint16
	family   *family
}

func key(p Port) portKey {
	return portKey{p.ClusterIP, p.Protocol, p.Port, p.NodePort, p.family()}
}

// forget deletes the conntrack entries of stale flows, through the
// ClusterIP, the external addresses and the NodePort, in the conntrack
// table of each flow's family.
func forget(stale []staleFlow) error {
	var errs []error
	for _, s := range stale {
		family := netlink.InetFamily(netlink.FAMILY_V4)
		if s.endpoint.Is6() {
			family = netlink.FAMILY_V6
		}
		var filters []netlink.CustomConntrackFilter
		for _, ip := range append([]netip.Addr{s.port.ClusterIP}, s.port.ExternalIPs...) {
			if !ip.IsValid() {
				continue // a hostPort
			}
			viaIP := &netlink.ConntrackFilter{}
			errs = append(errs,
				viaIP.AddProtocol(unix.IPPROTO_UDP),
				viaIP.AddIP(netlink.ConntrackOrigDstIP, net.IP(ip.AsSlice())),
				viaIP.AddPort(netlink.ConntrackOrigDstPort, s.port.Port),
				viaIP.AddIP(netlink.ConntrackReplySrcIP, net.IP(s.endpoint.AsSlice())))
			filters = append(filters, viaIP)
		}
		if s.port.NodePort != 0 {
			viaNodePort := &netlink.ConntrackFilter{}
			errs = append(errs,
				viaNodePort.AddProtocol(unix.IPPROTO_UDP),
				viaNodePort.AddPort(netlink.ConntrackOrigDstPort, s.port.NodePort),
				viaNodePort.AddIP(netlink.ConntrackReplySrcIP, net.IP(s.endpoint.AsSlice())))
			filters = append(filters, viaNodePort)
		}
		_, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, filters...)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
