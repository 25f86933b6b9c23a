package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/agent"
	"github.com/kelp-dev/kelp/embed"
	"github.com/kelp-dev/kelp/internal/apiserver"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/controllermanager"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/kubeconfig"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/scheduler"
	"github.com/kelp-dev/kelp/internal/joinapi"
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

// Run starts the control plane and blocks until ctx ends or a component
// fails, then stops everything in reverse order.
func Run(ctx context.Context, cfg config.Server) error {
	err := run(ctx, cfg)
	if errors.Is(err, errStopped) {
		log.Info("stop requested during start-up")
		return nil
	}
	return err
}

func run(ctx context.Context, cfg config.Server) error {
	if err := preflight(cfg); err != nil {
		return err
	}
	started := time.Now()
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

	// Components run on contexts of their own and are stopped one by one:
	// the order matters (controller-manager before the apiserver it needs
	// to release its lease, apiserver before its datastore).
	run := context.WithoutCancel(ctx)
	store, err := datastore.Start(run, datastoreConfig(cfg, certs))
	if err != nil {
		return err
	}
	var stoppers []func(context.Context) error
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		componentsCtx, cancelComponents := context.WithTimeout(stopCtx, stopTimeout-storeStopReserve)
		defer cancelComponents()
		for i := len(stoppers) - 1; i >= 0; i-- {
			if err := stoppers[i](componentsCtx); err != nil {
				log.WithError(err).Error("stop")
			}
		}
		if err := store.Close(stopCtx); err != nil {
			log.WithError(err).Error("stop")
		}
		log.Info("kelp server stopped")
	}()
	if err := waitFor(ctx, store.WaitReady); err != nil {
		return err
	}

	// Nothing else can ever use a SQLite datastore: one server, so no
	// elections and no bookkeeping of other apiservers.
	single := store.Backend().Kind == datastore.KindSQLite
	api, err := apiserver.Start(run, apiserver.Args(apiserver.Config{
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
	}), joinapi.Routes(joinapi.Config{
		Certs:           certs,
		TokenFile:       tokens.server,
		AgentTokenFile:  tokens.agent,
		AdminKubeconfig: credPaths(cfg).admin,
		Agent:           agentConfig(cfg),
	}))
	if err != nil {
		return err
	}
	url := apiserver.LocalURL(cfg.BindAddress, cfg.HTTPSPort)
	stoppers = append(stoppers, func(ctx context.Context) error {
		// The apiserver exits the whole process (klog.Fatal) when it is
		// cancelled before its post-start hooks are done, so a stop asked
		// for during start-up lets it finish starting first.
		_ = apiserver.WaitReady(ctx, api, url, certs.ServerCA)
		return api.Stop(ctx)
	})
	if err := waitFor(ctx, func(ctx context.Context) error { return apiserver.WaitReady(ctx, api, url, certs.ServerCA) }); err != nil {
		return err
	}
	creds, err := writeKubeconfigs(cfg, url, certs)
	if err != nil {
		return err
	}
	if err := ensureJoinAPIAccess(ctx, creds.admin); err != nil {
		return err
	}
	if err := ensureControllerAccess(ctx, creds.admin); err != nil {
		return err
	}
	if !single {
		hostname, _ := os.Hostname()
		if err := releaseOwnLeases(ctx, creds.admin, hostname); err != nil {
			log.WithError(err).Warn("the controller-manager and the scheduler wait for their previous leases to expire")
		}
	}

	cm, err := controllermanager.Start(run, controllermanager.Args(controllermanager.Config{
		Kubeconfig:     creds.controllerManager,
		ClusterCIDR:    cfg.ClusterCIDR,
		ServiceCIDR:    cfg.ServiceCIDR,
		Certs:          certs,
		LeaderElection: !single,
		ExtraArgs:      cfg.ExtraArgs.ControllerManager,
	}))
	if err != nil {
		return err
	}
	stoppers = append(stoppers, cm.Stop)
	// The scheduler exits the process when its context ends, so it is
	// never cancelled: it ends with the process, after everything else.
	sched, err := scheduler.Start(run, scheduler.Args(scheduler.Config{
		Kubeconfig:     creds.scheduler,
		LeaderElection: !single,
		ExtraArgs:      cfg.ExtraArgs.Scheduler,
	}))
	if err != nil {
		return err
	}
	if err := waitFor(ctx, func(ctx context.Context) error { return controllermanager.WaitReady(ctx, cm) }); err != nil {
		return err
	}
	if err := waitFor(ctx, func(ctx context.Context) error { return scheduler.WaitReady(ctx, sched) }); err != nil {
		return err
	}
	log.WithFields(logrus.Fields{"datastore": store.Backend().Kind, "kubeconfig": cfg.WriteKubeconfig, "took": time.Since(started).Round(time.Millisecond)}).
		Info("kelp server is ready")

	// Nodes get their addresses, and lose the taint that keeps pods off a
	// node without them, from this controller.
	addresses, err := startNodeAddresses(run, creds.admin)
	if err != nil {
		return err
	}
	stoppers = append(stoppers, addresses.Stop)

	lbErr := make(<-chan error)
	if !cfg.Disable.ServiceLB {
		lb, err := startServiceLB(run, creds.admin)
		if err != nil {
			return err
		}
		stoppers = append(stoppers, lb.Stop)
		lbErr = lb.Err()
	}

	nodeErr := make(<-chan error)
	if !cfg.DisableAgent {
		if !cfg.Disable.CoreDNS {
			if err := ensureDNSObjects(ctx, creds.admin, cfg.ClusterDNS); err != nil {
				return err
			}
		}
		node, err := agent.Start(run, cfg.Agent(), staged, agent.Credentials{
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
		})
		if err != nil {
			return err
		}
		// The node stops first: its kubelet needs the apiserver to
		// report on the way out.
		stoppers = append(stoppers, node.Stop)
		if err := waitFor(ctx, node.WaitReady); err != nil {
			return err
		}
		nodeErr = node.Err()
		log.WithFields(logrus.Fields{"node": cfg.NodeName, "took": time.Since(started).Round(time.Millisecond)}).Info("kelp node is running")
	}

	select {
	case <-ctx.Done():
		log.Info("stopping kelp server")
		return nil
	case err := <-store.Err():
		return err
	case err := <-api.Err():
		return err
	case err := <-cm.Err():
		return err
	case err := <-sched.Err():
		return err
	case err := <-nodeErr:
		return err
	case err := <-lbErr:
		return err
	case err := <-addresses.Err():
		return err
	}
}

// waitFor runs a readiness wait bounded by readyTimeout and by ctx. A stop
// asked for during start-up (ctx ends) is not a failure: it returns
// errStopped, which Run turns into a clean exit.
func waitFor(ctx context.Context, wait func(context.Context) error) error {
	waitCtx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	err := wait(waitCtx)
	if err != nil && ctx.Err() != nil {
		return errStopped
	}
	return err
}

var errStopped = errors.New("stopped during start-up")

func pkiConfig(cfg config.Server) pki.Config {
	var ips []net.IP
	for _, ip := range slices.Concat(cfg.NodeIPs, []netip.Addr{cfg.AdvertiseAddress}) {
		ips = append(ips, net.IP(ip.AsSlice()))
	}
	return pki.Config{
		Dir:           filepath.Join(cfg.DataDir, "server", "tls"),
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

// credentials are the kubeconfigs of the in-process clients.
type credentials struct {
	controllerManager, scheduler, admin string
}

// credPaths lays out <data-dir>/server/cred.
func credPaths(cfg config.Server) credentials {
	dir := filepath.Join(cfg.DataDir, "server", "cred")
	return credentials{
		controllerManager: filepath.Join(dir, "controller.kubeconfig"),
		scheduler:         filepath.Join(dir, "scheduler.kubeconfig"),
		admin:             filepath.Join(dir, "admin.kubeconfig"),
	}
}

func writeKubeconfigs(cfg config.Server, url string, certs pki.Files) (credentials, error) {
	creds := credPaths(cfg)
	for _, f := range []struct {
		path      string
		cert, key string
	}{
		{creds.controllerManager, certs.ControllerManagerCert, certs.ControllerManagerKey},
		{creds.scheduler, certs.SchedulerCert, certs.SchedulerKey},
		{creds.admin, certs.AdminCert, certs.AdminKey},
	} {
		if err := kubeconfig.Write(f.path, 0o600, kubeconfig.Client{Server: url, CAFile: certs.ServerCA, CertFile: f.cert, KeyFile: f.key}); err != nil {
			return credentials{}, err
		}
	}
	admin := kubeconfig.Client{Server: url, CAFile: certs.ServerCA, CertFile: certs.AdminCert, KeyFile: certs.AdminKey}
	if err := kubeconfig.Write(cfg.WriteKubeconfig, cfg.WriteKubeconfigMode, admin); err != nil {
		return credentials{}, fmt.Errorf("%w (choose another path with --write-kubeconfig)", err)
	}
	return creds, nil
}
