package config

import (
	"net"
	"net/netip"
	"os"
)

// Host holds the facts about this machine that defaults are derived from.
type Host struct {
	Hostname string
	IP       netip.Addr // address of the default route, or the first global one
}

// DetectHost reads the hostname and a usable node IP of this machine.
func DetectHost() Host {
	name, _ := os.Hostname()
	return Host{Hostname: name, IP: detectIP()}
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
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Addr{}
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() && ip.IsGlobalUnicast() {
				return ip.Unmap()
			}
		}
	}
	return netip.Addr{}
}
