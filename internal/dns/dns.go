package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/hostcheck"
	"github.com/kelp-dev/kelp/internal/logging"
)

// AddressLabel marks the cluster DNS address kelp puts on the loopback
// interface, so that `kelp killall` finds it (an IPv4 one: IPv6 addresses
// have no labels).
const AddressLabel = "lo:kelpdns"

// Config is what a node's DNS server is built from.
type Config struct {
	Address    netip.Addr // the cluster DNS IP (--cluster-dns)
	Domain     string     // the cluster domain (--cluster-domain)
	Kubeconfig string     // credentials to watch Services and EndpointSlices
	ResolvConf string     // the host's resolvers, for everything else
	Corefile   string     // where the generated Corefile is written
}

// Custom is what users add to the configuration, from the ConfigMap
// CustomConfigMap in kube-system.
type Custom struct {
	Hosts        string   // the "hosts" key: lines of a hosts file
	ServerBlocks []string // the "*.server" keys: server blocks, in key order
}

// Corefile returns the CoreDNS configuration for cfg and custom.
func Corefile(cfg Config, custom Custom) string {
	var hosts string
	if strings.TrimSpace(custom.Hosts) != "" {
		hosts = "    hosts {\n"
		for _, line := range strings.Split(strings.TrimSpace(custom.Hosts), "\n") {
			hosts += "        " + strings.TrimSpace(line) + "\n"
		}
		hosts += "        fallthrough\n    }\n"
	}
	return fmt.Sprintf(`.:53 {
    bind %s
    errors
%s    kubernetes %s in-addr.arpa ip6.arpa {
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
%s`, cfg.Address, hosts, cfg.Domain, cfg.Kubeconfig, cfg.ResolvConf, strings.Join(custom.ServerBlocks, "\n"))
}

// Start puts the cluster DNS address on the loopback interface and serves
// DNS on it until Stop, following the user's CustomConfigMap through
// client.
func Start(cfg Config, client kubernetes.Interface) (*Server, error) {
	if err := addAddress(cfg.Address); err != nil {
		return nil, err
	}
	input, err := writeCorefile(cfg, Custom{})
	if err != nil {
		return nil, err
	}
	dnsserver.Quiet = true // no banner on kelp's output
	instance, err := caddy.Start(input)
	logging.RouteKlog()
	if err != nil {
		return nil, fmt.Errorf("start CoreDNS: %w", err)
	}
	s := &Server{cfg: cfg, instance: instance}
	s.watch = component.Go("dns customisation", func(ctx context.Context) error {
		return s.watchCustom(ctx, client)
	})
	return s, nil
}

func writeCorefile(cfg Config, custom Custom) (caddy.CaddyfileInput, error) {
	corefile := Corefile(cfg, custom)
	if err := os.MkdirAll(filepath.Dir(cfg.Corefile), 0o700); err != nil {
		return caddy.CaddyfileInput{}, fmt.Errorf("write the Corefile: %w", err)
	}
	if err := atomicfile.Write(cfg.Corefile, []byte(corefile), 0o600); err != nil {
		return caddy.CaddyfileInput{}, fmt.Errorf("write the Corefile: %w", err)
	}
	return caddy.CaddyfileInput{Contents: []byte(corefile), Filepath: cfg.Corefile, ServerTypeName: "dns"}, nil
}

var _ component.Component = (*Server)(nil)

// Server is a running DNS server.
type Server struct {
	cfg   Config
	watch *component.Running // of CustomConfigMap

	stopOnce sync.Once
	stopErr  error

	mu       sync.Mutex
	instance *caddy.Instance
	custom   Custom
}

// Customize restarts the server with custom, gracefully: a configuration
// CoreDNS refuses leaves the running one in place.
func (s *Server) Customize(custom Custom) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reflect.DeepEqual(custom, s.custom) {
		return nil
	}
	input, err := writeCorefile(s.cfg, custom)
	if err != nil {
		return err
	}
	instance, err := s.instance.Restart(input)
	logging.RouteKlog()
	if err != nil {
		// Put the file back to what runs.
		_, _ = writeCorefile(s.cfg, s.custom)
		return fmt.Errorf("%s/%s not applied: %w", "kube-system", CustomConfigMap, err)
	}
	s.instance, s.custom = instance, custom
	return nil
}

// Name names the DNS server in the node's lifecycle.
func (s *Server) Name() string { return "dns" }

// Ready is closed once it serves, which it does from Start on.
func (s *Server) Ready() <-chan struct{} { return s.watch.Ready() }

// Err reports a failure to follow CustomConfigMap.
func (s *Server) Err() <-chan error { return s.watch.Err() }

// Stop stops serving; the address stays, so pods keep a resolver that
// answers again as soon as the node is back.
func (s *Server) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		watchErr := s.watch.Stop(ctx)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.stopErr = errors.Join(watchErr, s.instance.Stop())
	})
	return s.stopErr
}

// BoundAddress is the cluster DNS address of the Corefile Start wrote at
// corefile (its first bind). `kelp killall` removes it from lo by it where
// it is IPv6, having no label to find it by.
func BoundAddress(corefile string) (netip.Addr, error) {
	b, err := os.ReadFile(corefile)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read the Corefile: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if addr, ok := strings.CutPrefix(strings.TrimSpace(line), "bind "); ok {
			ip, err := netip.ParseAddr(strings.TrimSpace(addr))
			if err != nil {
				return netip.Addr{}, fmt.Errorf("the Corefile %s binds %q: %w", corefile, addr, err)
			}
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("the Corefile %s binds no address", corefile)
}

// addAddress puts ip, the cluster DNS address, on lo: of the primary
// family of the service CIDRs, IPv6 in a cluster whose first service CIDR
// is IPv6.
func addAddress(ip netip.Addr) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("add the cluster DNS address to lo: %w", err)
	}
	bits := ip.BitLen()
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
	if ip.Is4() {
		addr.Label = AddressLabel
	} else {
		// Usable at once: there is no one on lo to detect a duplicate.
		// IPv6 addresses have no label.
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := netlink.AddrAdd(lo, addr); err != nil && !errors.Is(err, syscall.EEXIST) {
		if off, _ := hostcheck.IPv6Off("lo"); ip.Is6() && off {
			return fmt.Errorf("add the cluster DNS address %s to lo: IPv6 is disabled on this node (net.ipv6.conf.lo.disable_ipv6): enable it, or give the cluster an IPv4 service CIDR first", ip)
		}
		return fmt.Errorf("add the cluster DNS address %s to lo: %w", ip, err)
	}
	return nil
}
