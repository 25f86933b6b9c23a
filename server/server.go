package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/agent"
	"github.com/kelp-dev/kelp/embed"
	"github.com/kelp-dev/kelp/internal/apiserver"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/controllermanager"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/kubeconfig"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/scheduler"
	"github.com/kelp-dev/kelp/internal/systemobjects"
)

const (
	// readyTimeout bounds each readiness wait; a Raspberry Pi on an SD card
	// is the slow end.
	readyTimeout = 2 * time.Minute
	// stopTimeout bounds the whole shutdown after SIGTERM; the datastore,
	// stopped last, always keeps storeStopReserve of it to close cleanly.
	stopTimeout      = 10 * time.Second
	storeStopReserve = 3 * time.Second
)

var log = logrus.WithField("component", "server")

// Run starts the control plane and, unless disabled, the node beside it,
// and blocks until ctx ends or a piece fails; then it stops everything in
// reverse order.
func Run(ctx context.Context, cfg config.Server) error {
	g := component.NewGroup(ctx, readyTimeout, component.StopReserve(storeStopReserve))
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := g.Stop(stopCtx); err != nil {
			log.WithError(err).Error("stop")
		}
		log.Info("kelp server stopped")
	}()
	if err := start(ctx, g, cfg); err != nil {
		if errors.Is(err, component.ErrStopped) || ctx.Err() != nil {
			log.Info("stop requested during start-up")
			return nil
		}
		return err
	}
	return g.Wait()
}

// start adds the server's pieces to g in order, each ready before the
// next starts; ctx bounds the steps between them.
func start(ctx context.Context, g *component.Group, cfg config.Server) error {
	if err := preflight(cfg); err != nil {
		return err
	}
	began := time.Now()
	paths := layout.Server(cfg.DataDir)
	// The control plane itself needs nothing from the bundle; staging it
	// here means the node that will run beside it finds runc, the CNI
	// plugins and the pause image in place.
	staged, err := embed.Stage(cfg.DataDir)
	if err != nil {
		return err
	}
	log.WithField("dir", staged.Dir).Debug("bundle staged")
	certs, err := pki.Ensure(pkiConfig(cfg))
	if err != nil {
		return err
	}
	tokens, err := ensureTokens(cfg, certs)
	if err != nil {
		return err
	}

	store, err := datastore.Start(ctx, datastoreConfig(cfg, certs))
	if err := g.Start(store, err); err != nil {
		return err
	}
	// Nothing else can ever use a SQLite datastore: one server, so no
	// elections and no bookkeeping of other apiservers.
	single := store.Backend().Kind == datastore.KindSQLite
	if err := g.Start(apiserver.Start(apiserver.Config{
		BindAddress:          cfg.BindAddress,
		Port:                 cfg.HTTPSPort,
		AdvertiseAddress:     cfg.AdvertiseAddress,
		ServiceCIDR:          cfg.ServiceCIDR,
		ServiceNodePortRange: cfg.ServiceNodePortRange,
		ClusterDomain:        cfg.ClusterDomain,
		Certs:                certs,
		Storage:              store.Backend(),
		SingleServer:         single,
		ExtraArgs:            cfg.ExtraArgs.APIServer,
	}, joinapi.Routes(joinapi.Config{
		Certs:           certs,
		TokenFile:       tokens.server,
		AgentTokenFile:  tokens.agent,
		AdminKubeconfig: paths.AdminKubeconfig,
		Agent:           agentConfig(cfg),
	}))); err != nil {
		return err
	}
	url := apiserver.LocalURL(cfg.BindAddress, cfg.HTTPSPort)
	if err := writeKubeconfigs(cfg, url, certs); err != nil {
		return err
	}
	admin, err := adminClient(paths.AdminKubeconfig)
	if err != nil {
		return err
	}
	if err := systemobjects.Apply(ctx, admin, systemobjects.Config{DNS: !cfg.Disable.CoreDNS, ClusterDNS: cfg.ClusterDNS}); err != nil {
		return err
	}
	if !single {
		hostname, _ := os.Hostname()
		if err := releaseOwnLeases(ctx, paths.AdminKubeconfig, hostname); err != nil {
			log.WithError(err).Warn("the controller-manager and the scheduler wait for their previous leases to expire")
		}
	}
	if err := g.Start(controllermanager.Start(controllermanager.Config{
		Kubeconfig:     paths.ControllerManagerKubeconfig,
		ClusterCIDR:    cfg.ClusterCIDR,
		ServiceCIDR:    cfg.ServiceCIDR,
		Certs:          certs,
		LeaderElection: !single,
		ExtraArgs:      cfg.ExtraArgs.ControllerManager,
	})); err != nil {
		return err
	}
	if err := g.Start(scheduler.Start(scheduler.Config{
		Kubeconfig:     paths.SchedulerKubeconfig,
		LeaderElection: !single,
		ExtraArgs:      cfg.ExtraArgs.Scheduler,
	})); err != nil {
		return err
	}
	log.WithFields(logrus.Fields{"datastore": store.Backend().Kind, "kubeconfig": cfg.WriteKubeconfig, "took": time.Since(began).Round(time.Millisecond)}).
		Info("kelp server is ready")

	// Nodes get their addresses, and lose the taint that keeps pods off a
	// node without them, from this controller.
	if err := g.Start(startNodeAddresses(paths.AdminKubeconfig)); err != nil {
		return err
	}
	if !cfg.Disable.ServiceLB {
		if err := g.Start(startServiceLB(paths.AdminKubeconfig)); err != nil {
			return err
		}
	}
	if cfg.DisableAgent {
		return nil
	}
	if err := agent.Start(ctx, g, cfg.Agent(), staged, agent.Credentials{
		Server:         url,
		ServerCA:       certs.ServerCA,
		ClientCA:       certs.ClientCA,
		KubeletCert:    certs.KubeletClientCert,
		KubeletKey:     certs.KubeletClientKey,
		ServingCert:    certs.KubeletServingCert,
		ServingKey:     certs.KubeletServingKey,
		ProxyCert:      certs.KubeProxyCert,
		ProxyKey:       certs.KubeProxyKey,
		DNSCert:        certs.DNSCert,
		DNSKey:         certs.DNSKey,
		ControllerCert: certs.ControllerCert,
		ControllerKey:  certs.ControllerKey,
	}); err != nil {
		return err
	}
	log.WithFields(logrus.Fields{"node": cfg.NodeName, "took": time.Since(began).Round(time.Millisecond)}).Info("kelp node is running")
	return nil
}

func pkiConfig(cfg config.Server) pki.Config {
	var ips []net.IP
	for _, ip := range slices.Concat(cfg.NodeIPs, []netip.Addr{cfg.AdvertiseAddress}) {
		ips = append(ips, net.IP(ip.AsSlice()))
	}
	return pki.Config{
		Dir:           layout.Server(cfg.DataDir).TLS,
		Hostname:      cfg.NodeName,
		IPs:           ips,
		ExtraSANs:     cfg.TLSSANs,
		ServiceIP:     net.IP(cfg.FirstServiceIP().AsSlice()),
		ClusterDomain: cfg.ClusterDomain,
	}
}

func datastoreConfig(cfg config.Server, certs pki.Files) datastore.Config {
	return datastore.Config{
		DataDir:     cfg.DataDir,
		Endpoint:    cfg.Datastore.Endpoint,
		CAFile:      cfg.Datastore.CAFile,
		CertFile:    cfg.Datastore.CertFile,
		KeyFile:     cfg.Datastore.KeyFile,
		ClusterInit: cfg.ClusterInit,
		Name:        cfg.NodeName,
		AdvertiseIP: cfg.AdvertiseAddress.String(),
		EtcdTLS: datastore.EtcdTLS{
			ServerCA:   certs.EtcdServerCA,
			ServerCert: certs.EtcdServerCert,
			ServerKey:  certs.EtcdServerKey,
			PeerCA:     certs.EtcdPeerCA,
			PeerCert:   certs.EtcdPeerCert,
			PeerKey:    certs.EtcdPeerKey,
			ClientCert: certs.EtcdClientCert,
			ClientKey:  certs.EtcdClientKey,
		},
	}
}

// writeKubeconfigs writes the in-process clients' kubeconfigs and the
// admin's at --write-kubeconfig.
func writeKubeconfigs(cfg config.Server, url string, certs pki.Files) error {
	paths := layout.Server(cfg.DataDir)
	for _, f := range []struct {
		path      string
		cert, key string
	}{
		{paths.ControllerManagerKubeconfig, certs.ControllerManagerCert, certs.ControllerManagerKey},
		{paths.SchedulerKubeconfig, certs.SchedulerCert, certs.SchedulerKey},
		{paths.AdminKubeconfig, certs.AdminCert, certs.AdminKey},
	} {
		if err := kubeconfig.Write(f.path, 0o600, kubeconfig.Client{Server: url, CAFile: certs.ServerCA, CertFile: f.cert, KeyFile: f.key}); err != nil {
			return err
		}
	}
	admin := kubeconfig.Client{Server: url, CAFile: certs.ServerCA, CertFile: certs.AdminCert, KeyFile: certs.AdminKey}
	if err := kubeconfig.Write(cfg.WriteKubeconfig, cfg.WriteKubeconfigMode, admin); err != nil {
		return fmt.Errorf("%w (choose another path with --write-kubeconfig)", err)
	}
	return nil
}
