package server

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"

	"github.com/kelp-dev/kelp/agent"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/kubelet"
	"github.com/kelp-dev/kelp/internal/registries"
)

// preflight catches the mistakes a user can make before anything is
// written, each with what to do about it.
func preflight(cfg config.Server) error {
	if os.Geteuid() != 0 {
		return errors.New("kelp server must run as root (it manages certificates, mounts and the network of this machine): run it with sudo")
	}
	if err := checkWritable(cfg.DataDir); err != nil {
		return err
	}
	loopback := netip.MustParseAddr("127.0.0.1")
	ports := []listenPort{
		{cfg.BindAddress, cfg.HTTPSPort, "the apiserver (--https-listen-port)"},
		{loopback, 10257, "kube-controller-manager"},
		{loopback, 10259, "kube-scheduler"},
	}
	if cfg.ClusterInit {
		ports = append(ports,
			listenPort{loopback, 2379, "embedded etcd clients"},
			listenPort{cfg.AdvertiseAddress, 2380, "embedded etcd peers"})
	}
	if !cfg.DisableAgent {
		if err := agent.CheckHost(); err != nil {
			return err
		}
		// Loaded again by the node; a mistake in it is cheaper to report
		// before the control plane starts.
		if _, err := registries.Load(cfg.PrivateRegistry); err != nil {
			return err
		}
		ports = append(ports,
			listenPort{loopback, kubelet.HealthzPort, "the kubelet's health check"},
			listenPort{netip.IPv4Unspecified(), 10250, "the kubelet"},
			listenPort{loopback, 10010, "containerd's streaming server"})
	}
	for _, p := range ports {
		addr := net.JoinHostPort(p.addr.String(), strconv.Itoa(p.port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("port %d for %s is not free (%w): is kelp or another Kubernetes already running? `ss -ltnp 'sport = %d'` shows who holds it", p.port, p.what, err, p.port)
		}
		l.Close()
	}
	return nil
}

// listenPort is an address kelp will listen on.
type listenPort struct {
	addr netip.Addr
	port int
	what string
}

func checkWritable(dir string) error {
	fail := func(err error) error {
		return fmt.Errorf("data dir %s is not writable (%w): fix its permissions or mount, or choose another with --data-dir", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(err)
	}
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return fail(err)
	}
	f.Close()
	return os.Remove(f.Name())
}
