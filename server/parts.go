package server

import (
	"context"
	"fmt"
	"os"

	"github.com/kelp-dev/kelp/embed"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/controllermanager"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/etcdmembers"
	"github.com/kelp-dev/kelp/internal/gateway"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/nodeaddress"
	"github.com/kelp-dev/kelp/internal/scheduler"
	"github.com/kelp-dev/kelp/internal/servicelb"
	"github.com/kelp-dev/kelp/internal/snapshot"
	"github.com/kelp-dev/kelp/internal/systemobjects"
	"github.com/kelp-dev/kelp/internal/volumeadmission"
)

// part is one of the server's pieces after the apiserver. A built-in part
// is a row of controlPlane or controllers.
type part struct {
	name string
	// enabled says whether this server runs the part; nil: always.
	enabled func(e *env) bool
	// Either start adds the part to g, or takes its step, and returns
	// once it is ready; or run is the part, run until ctx ends.
	start func(ctx context.Context, g *component.Group, e *env) error
	run   func(ctx context.Context, e *env) error
}

// controlPlane are the parts the server starts, in order, before it says
// it is ready.
func controlPlane() []part {
	return []part{
		// First, so that it stops after the parts that read it.
		{name: "informer cache", run: func(ctx context.Context, e *env) error { return e.admin.informers.Run(ctx) }},
		// The volumes webhook serves before its configuration, applied
		// with the system objects, tells the apiserver to call it.
		{name: "volumes webhook", start: func(ctx context.Context, g *component.Group, e *env) error {
			return g.Start(volumeadmission.Start(ctx, volumeadmission.Config{Client: e.admin.kube, Serving: e.certs.APIServer}))
		}},
		{name: "system objects", start: applySystemObjects},
		{name: "secrets re-encryption", enabled: func(e *env) bool { return e.reencrypt }, run: func(ctx context.Context, e *env) error {
			reencryptSecrets(ctx, e.paths, e.admin.kube, e.store.Backend())
			<-ctx.Done()
			return nil
		}},
		{name: "server node", enabled: func(e *env) bool { return !e.cfg.DisableAgent }, start: func(ctx context.Context, _ *component.Group, e *env) error {
			return joinapi.ClaimServerNode(ctx, e.admin.kube, e.cfg.Node.NodeName)
		}},
		// The metrics API listens before the manifests register it with
		// the apiserver, which would otherwise report it unreachable.
		{name: "metrics", enabled: func(e *env) bool { return !e.cfg.Disable.MetricsServer }, start: startMetrics},
		{name: "manifests", start: startAddons},
		// A part of its own, since it may wait for a lease to go
		// unrenewed; it then idles until the server stops.
		{name: "leader leases", enabled: (*env).leaderElection, run: func(ctx context.Context, e *env) error {
			hostname, _ := os.Hostname()
			if err := releaseOwnLeases(ctx, e.admin.kube, hostname, leaseHolderGone); err != nil && ctx.Err() == nil {
				log.WithError(err).Warn("the controller-manager and the scheduler wait for their previous leases to expire")
			}
			<-ctx.Done()
			return nil
		}},
		{name: "controller-manager", start: func(_ context.Context, g *component.Group, e *env) error {
			return g.Start(controllermanager.Start(controllermanager.Config{
				Kubeconfig:     e.paths.ControllerManagerKubeconfig,
				ClusterCIDRs:   e.cfg.ClusterCIDRs,
				ServiceCIDRs:   e.cfg.ServiceCIDRs,
				Certs:          e.certs,
				LeaderElection: e.leaderElection(),
				ExtraArgs:      e.cfg.ExtraArgs.ControllerManager,
			}))
		}},
		{name: "scheduler", start: func(_ context.Context, g *component.Group, e *env) error {
			return g.Start(scheduler.Start(scheduler.Config{
				Kubeconfig:     e.paths.SchedulerKubeconfig,
				LeaderElection: e.leaderElection(),
				ExtraArgs:      e.cfg.ExtraArgs.Scheduler,
			}))
		}},
	}
}

// controllers are the server's controllers, started once the server is
// ready. Those that act for the whole cluster take turns with the other
// servers' (leaderElection).
func controllers() []part {
	return []part{
		// Nodes get their addresses, and lose the taint that keeps pods
		// off a node without them, from this controller.
		{name: "node addresses", run: func(ctx context.Context, e *env) error { return nodeaddress.Run(ctx, e.admin.kube, e.admin.informers) }},
		{name: "etcd members", enabled: embeddedEtcd, run: func(ctx context.Context, e *env) error {
			return etcdmembers.Run(ctx, e.admin.informers, e.store.Members())
		}},
		{name: "etcd defrag", enabled: embeddedEtcd, run: func(ctx context.Context, e *env) error { return datastore.Defrag(ctx, e.store.Backend()) }},
		{name: "servicelb", enabled: func(e *env) bool { return !e.cfg.Disable.ServiceLB }, run: func(ctx context.Context, e *env) error {
			return servicelb.Run(ctx, e.admin.kube, e.admin.informers)
		}},
		{name: "helm-controller", enabled: helmController, run: runHelmController},
		{name: "gateway controller", enabled: func(e *env) bool { return !e.cfg.Disable.Gateway }, run: func(ctx context.Context, e *env) error {
			return gateway.RunController(ctx, gateway.ControllerConfig{
				Client:         e.admin.config,
				Kube:           e.admin.kube,
				Extensions:     e.admin.extensions,
				CRDs:           embed.GatewayCRDs(),
				LeaderElection: e.leaderElection(),
				AddressRanges:  e.cfg.GatewayAddressRanges,
				Informers:      e.admin.informers,
			})
		}},
		{name: "upgrade controller", start: startUpgradeController},
		{name: "snapshots", enabled: func(e *env) bool { return !e.cfg.Snapshots.Disabled && e.cfg.Datastore.Endpoint == "" }, run: func(ctx context.Context, e *env) error {
			return snapshot.Schedule(ctx, snapshot.ScheduleConfig{Snapshots: e.cfg.Snapshots, DataDir: e.cfg.DataDir, Node: e.cfg.NodeName, Events: e.admin.kube})
		}},
		// Last: every part asked for its informers. Those a controller
		// asks for later (while it leads) it starts itself.
		{name: "informers", start: func(_ context.Context, _ *component.Group, e *env) error {
			e.admin.informers.Start()
			return nil
		}},
	}
}

// startParts starts the enabled parts in order.
func startParts(ctx context.Context, g *component.Group, e *env, parts []part) error {
	for _, p := range parts {
		if p.enabled != nil && !p.enabled(e) {
			continue
		}
		var err error
		if p.run != nil {
			err = g.Go(p.name, func(ctx context.Context) error { return p.run(ctx, e) })
		} else {
			err = p.start(ctx, g, e)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// embeddedEtcd says the server runs an embedded etcd member, whose
// membership and disk it keeps.
func embeddedEtcd(e *env) bool {
	return e.store.Members() != nil
}

func helmController(e *env) bool {
	return !e.cfg.Disable.HelmController
}

func applySystemObjects(ctx context.Context, _ *component.Group, e *env) error {
	serverCA, err := os.ReadFile(e.certs.ServerCA.Cert)
	if err != nil {
		return fmt.Errorf("read the server CA: %w", err)
	}
	return systemobjects.Apply(ctx, e.admin.kube, systemobjects.Config{DNS: !e.cfg.Disable.CoreDNS, ClusterDNS: e.cfg.ClusterDNS, ServerCA: serverCA})
}
