package agent

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"

	"github.com/kelp-dev/kelp/internal/kubelet"
)

// Port is an address a kelp process will listen on.
type Port struct {
	Addr netip.Addr
	Port int
	What string
}

// NodePorts are the addresses a node listens on.
func NodePorts() []Port {
	loopback := netip.MustParseAddr("127.0.0.1")
	return []Port{
		{loopback, kubelet.HealthzPort, "the kubelet's health check"},
		{netip.IPv4Unspecified(), 10250, "the kubelet"},
		{loopback, 10010, "containerd's streaming server"},
	}
}

// CheckPorts says which of ports another program holds, and how to find it.
func CheckPorts(ports []Port) error {
	for _, p := range ports {
		addr := net.JoinHostPort(p.Addr.String(), strconv.Itoa(p.Port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("port %d for %s is not free (%w): is kelp or another Kubernetes already running? `ss -ltnp 'sport = %d'` shows who holds it", p.Port, p.What, err, p.Port)
		}
		l.Close()
	}
	return nil
}

// CheckWritable fails, saying what to do, if kelp cannot write to dir.
func CheckWritable(dir string) error {
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
