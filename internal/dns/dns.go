package dns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/vishvananda/netlink"
)

// AddressLabel marks the cluster DNS address kelp puts on the loopback
// interface, so that `kelp killall` finds it.
const AddressLabel = "lo:kelpdns"

// Config is what a node's DNS server is built from.
type Config struct {
	Address    netip.Addr // the cluster DNS IP (--cluster-dns)
	Domain     string     // the cluster domain (--cluster-domain)
	Kubeconfig string     // credentials to watch Services and EndpointSlices
	ResolvConf string     // the host's resolvers, for everything else
	Corefile   string     // where the generated Corefile is written
}

// Corefile returns the CoreDNS configuration for cfg.
func Corefile(cfg Config) string {
	return fmt.Sprintf(`.:53 {
    bind %s
    errors
    kubernetes %s in-addr.arpa ip6.arpa {
        kubeconfig %s
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    forward . %s
    cache 30
    loop
    loadbalance
}
`, cfg.Address, cfg.Domain, cfg.Kubeconfig, cfg.ResolvConf)
}

// Start puts the cluster DNS address on the loopback interface and serves
// DNS on it until Stop.
func Start(cfg Config) (*Server, error) {
	if err := addAddress(cfg.Address); err != nil {
		return nil, err
	}
	corefile := Corefile(cfg)
	if err := os.MkdirAll(filepath.Dir(cfg.Corefile), 0o700); err != nil {
		return nil, fmt.Errorf("dns: %w", err)
	}
	if err := os.WriteFile(cfg.Corefile, []byte(corefile), 0o600); err != nil {
		return nil, fmt.Errorf("dns: %w", err)
	}
	dnsserver.Quiet = true // no banner on kelp's output
	instance, err := caddy.Start(caddy.CaddyfileInput{Contents: []byte(corefile), Filepath: cfg.Corefile, ServerTypeName: "dns"})
	if err != nil {
		return nil, fmt.Errorf("dns: start CoreDNS: %w", err)
	}
	return &Server{instance: instance}, nil
}

// Server is a running DNS server.
type Server struct {
	instance *caddy.Instance
}

// Stop stops serving; the address stays, so pods keep a resolver that
// answers again as soon as the node is back.
func (s *Server) Stop() error {
	return s.instance.Stop()
}

func addAddress(ip netip.Addr) error {
	if !ip.Is4() {
		return fmt.Errorf("dns: cluster DNS address %s: only IPv4 is supported so far", ip)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("dns: %w", err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}, Label: AddressLabel}
	if err := netlink.AddrAdd(lo, addr); err != nil && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("dns: add %s to lo: %w", ip, err)
	}
	return nil
}
