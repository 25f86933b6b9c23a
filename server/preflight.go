package server

import (
	"errors"
	"net/netip"
	"os"

	"github.com/kelp-dev/kelp/agent"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/metrics"
	"github.com/kelp-dev/kelp/internal/registries"
	"github.com/kelp-dev/kelp/internal/volumeadmission"
)

var errNotRoot = errors.New("kelp server must run as root (it manages certificates, mounts and the network of this machine): run it with sudo")

// preflight catches the mistakes a user can make before anything is
// written, each with what to do about it.
func preflight(cfg config.Server) error {
	if os.Geteuid() != 0 {
		return errNotRoot
	}
	if err := agent.CheckWritable(cfg.DataDir); err != nil {
		return err
	}
	loopback := netip.MustParseAddr("127.0.0.1")
	ports := []agent.Port{
		{Addr: cfg.BindAddress, Port: cfg.HTTPSPort, What: "the apiserver (--https-listen-port)"},
		{Addr: loopback, Port: 10257, What: "kube-controller-manager"},
		{Addr: loopback, Port: 10259, What: "kube-scheduler"},
		{Addr: loopback, Port: volumeadmission.Port, What: "the volume admission webhook"},
	}
	if !cfg.Disable.MetricsServer {
		ports = append(ports, agent.Port{Addr: cfg.BindAddress, Port: metrics.Port, What: "the metrics API (--disable metrics-server if you run metrics-server yourself)"})
	}
	if cfg.EmbeddedEtcd() {
		ports = append(ports,
			agent.Port{Addr: loopback, Port: 2379, What: "embedded etcd clients"},
			agent.Port{Addr: cfg.AdvertiseAddress, Port: 2380, What: "embedded etcd peers"})
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
		ports = append(ports, agent.NodePorts()...)
	}
	return agent.CheckPorts(ports)
}
