package config

import (
	"net"
	"net/netip"
	"os"

	"github.com/kelp-dev/kelp/internal/hostcheck"
)

// Host holds the facts about this machine that defaults are derived from.
type Host struct {
	Hostname string
	IP       netip.Addr // address of the default route, or the first global one
	// Networks are the machine's interface addresses with their prefix
	// lengths (10.0.0.5/24): a node's network is the one holding its IP.
	Networks []netip.Prefix
	// IPv6Disabled is net.ipv6.conf.all.disable_ipv6, or a kernel without
	// IPv6.
	IPv6Disabled bool
}

// DetectHost reads the hostname and a usable node IP of this machine.
func DetectHost() Host {
	name, _ := os.Hostname()
	return Host{Hostname: name, IP: detectIP(), Networks: Networks(), IPv6Disabled: ipv6Disabled()}
}

func detectIP() netip.Addr {
	// Connecting a UDP socket sends nothing; it only asks the kernel which
	// source address the default route would use.
	if conn, err := net.Dial("udp4", "192.0.2.1:9"); err == nil {
		defer conn.Close()
		if a, ok := conn.LocalAddr().(*net.UDPAddr); ok {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				return ip.Unmap()
			}
		}
	}
	for _, n := range Networks() {
		if n.Addr().Is4() && n.Addr().IsGlobalUnicast() {
			return n.Addr()
		}
	}
	return netip.Addr{}
}

// Networks are the machine's interface addresses with their prefix
// lengths (10.0.0.5/24), as Host.Networks.
func Networks() []netip.Prefix {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		bits, _ := n.Mask.Size()
		out = append(out, netip.PrefixFrom(ip.Unmap(), bits))
	}
	return out
}

func ipv6Disabled() bool {
	off, err := hostcheck.IPv6Off("all")
	return off || err != nil
}
