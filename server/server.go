package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kelp-dev/kelp/agent"
	"github.com/kelp-dev/kelp/embed"
	"github.com/kelp-dev/kelp/internal/apiserver"
	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/bootguard"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/controllermanager"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/etcdmembers"
	"github.com/kelp-dev/kelp/internal/gateway"
	"github.com/kelp-dev/kelp/internal/helmchart"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/kubeconfig"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/nodeaddress"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/profiling"
	"github.com/kelp-dev/kelp/internal/scheduler"
	"github.com/kelp-dev/kelp/internal/secretsencrypt"
	"github.com/kelp-dev/kelp/internal/servicelb"
	"github.com/kelp-dev/kelp/internal/snapshot"
	"github.com/kelp-dev/kelp/internal/systemobjects"
	"github.com/kelp-dev/kelp/internal/version"
	"github.com/kelp-dev/kelp/internal/volumeadmission"
)

// storeStopReserve is kept of the stop deadline for the datastore, stopped
// last, to close cleanly.
const storeStopReserve = 3 * time.Second

var log = logrus.WithField("component", "server")

// Run starts the control plane and, unless disabled, the node beside it,
// and blocks until ctx ends or a piece fails; then it stops everything in
// reverse order.
//
// A kelp of another version than the one that last became ready on the
// data dir is an upgrade on trial, which the boot guard rolls back if it
// does not become ready within --upgrade-attempts starts (package
// bootguard).
func Run(ctx context.Context, cfg config.Server) error {
	guard, err := beginGuard(cfg)
	if err != nil {
		return err
	}
	defer guard.Close()
	err = component.Run(ctx, "kelp server", log, func(ctx context.Context, g *component.Group) error {
		if err := start(ctx, g, cfg, guard); err != nil {
			return err
		}
		return guard.Ready()
	}, component.StopReserve(storeStopReserve))
	return guard.Finish(err)
}

// start adds the server's pieces to g in order, each ready before the
// next starts; ctx bounds the steps between them.
func start(ctx context.Context, g *component.Group, cfg config.Server, guard *bootguard.Guard) error {
	if err := preflight(cfg); err != nil {
		return err
	}
	if cfg.PprofAddress.IsValid() {
		if err := g.Start(profiling.Start(cfg.PprofAddress)); err != nil {
			return err
		}
	}
	began := time.Now()
	paths := layout.Server(cfg.DataDir)
	if err := os.MkdirAll(paths.Dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", paths.Dir, err)
	}
	if err := version.CheckDataDir(paths.Versions, version.Ran{Kelp: version.Version, Kubernetes: version.Kubernetes()}); err != nil {
		return err
	}
	// The control plane itself needs nothing from the bundle; staging it
	// here means the node that will run beside it finds runc, the CNI
	// plugins and the pause image in place.
	staged, err := embed.Stage(cfg.DataDir)
	if err != nil {
		return err
	}
	log.WithField("dir", staged.Dir).Debug("bundle staged")
	cluster, err := joinCluster(ctx, cfg)
	if err != nil {
		return err
	}
	certs, err := pki.Ensure(pkiConfig(cfg))
	if err != nil {
		return err
	}
	tokens, err := ensureTokens(cfg, certs, cluster.agentToken)
	if err != nil {
		return err
	}

	audit, err := writeAPIServerFiles(cfg)
	if err != nil {
		return err
	}
	encryption, reencrypt, err := secretsEncryption(cfg, cluster.encryptionConfig)
	if err != nil {
		return err
	}
	if err := beforeDatastore(ctx, cfg, guard); err != nil {
		return err
	}
	if err := migrateToEtcd(ctx, cfg, certs); err != nil {
		return err
	}
	dc := datastoreConfig(cfg, certs)
	dc.InitialCluster = cluster.initialCluster
	store, err := datastore.Start(ctx, dc)
	if err := g.Start(store, err); err != nil {
		return err
	}
	if err := snapshotEtcd(ctx, cfg, guard, store.Backend().Kind); err != nil {
		return err
	}
	// A nil *Members in the interface would look like a member list.
	var members joinapi.Members
	if m := store.Members(); m != nil {
		members = m
	}
	// Nothing else can ever use a SQLite datastore: one server, so no
	// elections and no bookkeeping of other apiservers.
	single := store.Backend().Kind == datastore.KindSQLite
	// With one server, its RAM store is the only copy of the leases, so
	// it is as consistent as the datastore; on etcd or an external
	// datastore, which other servers share, it would not be.
	var ram datastore.Backend
	if single && !cfg.DisableRAMStore {
		rs, err := datastore.StartRAM(ctx, datastore.RAMConfig{DataDir: cfg.DataDir})
		if err := g.Start(rs, err); err != nil {
			return err
		}
		ram = rs.Backend()
	}
	if err := g.Start(apiserver.Start(apiserver.Config{
		BindAddress:              cfg.BindAddress,
		Port:                     cfg.HTTPSPort,
		AdvertiseAddress:         cfg.AdvertiseAddress,
		ServiceCIDRs:             cfg.ServiceCIDRs,
		ServiceNodePortRange:     cfg.ServiceNodePortRange,
		ClusterDomain:            cfg.ClusterDomain,
		Certs:                    certs,
		Storage:                  store.Backend(),
		RAMStorage:               ram,
		SingleServer:             single,
		Audit:                    audit,
		AdmissionConfigFile:      paths.AdmissionConfig,
		AuthenticationConfigFile: paths.AuthenticationConfig,
		EncryptionConfigFile:     encryption,
		ExtraArgs:                cfg.ExtraArgs.APIServer,
		ForeignWrites:            guard.WriteWatch(),
	}, routes(cfg, joinapi.Config{
		Certs:                certs,
		TokenFile:            tokens.server,
		AgentTokenFile:       tokens.agent,
		AdminKubeconfig:      paths.AdminKubeconfig,
		Agent:                agentConfig(cfg),
		Datastore:            store.Backend().Kind,
		Members:              members,
		EncryptionConfigFile: paths.EncryptionConfig,
	}))); err != nil {
		return err
	}
	url := apiserver.LocalURL(cfg.BindAddress, cfg.HTTPSPort)
	if err := writeKubeconfigs(cfg, url, certs); err != nil {
		return err
	}
	if err := startCertRenewal(ctx, g, cfg, certs); err != nil {
		return err
	}
	admin, err := adminClient(paths.AdminKubeconfig)
	if err != nil {
		return err
	}
	// The volumes webhook serves before its configuration, applied with
	// the system objects, tells the apiserver to call it.
	if err := g.Start(volumeadmission.Start(ctx, volumeadmission.Config{Client: admin, Serving: certs.APIServer})); err != nil {
		return err
	}
	serverCA, err := os.ReadFile(certs.ServerCA.Cert)
	if err != nil {
		return fmt.Errorf("read the server CA: %w", err)
	}
	if err := systemobjects.Apply(ctx, admin, systemobjects.Config{DNS: !cfg.Disable.CoreDNS, ClusterDNS: cfg.ClusterDNS, ServerCA: serverCA}); err != nil {
		return err
	}
	if reencrypt {
		if err := g.Go("secrets re-encryption", func(ctx context.Context) error {
			reencryptSecrets(ctx, cfg.DataDir, admin, store.Backend())
			<-ctx.Done()
			return nil
		}); err != nil {
			return err
		}
	}
	if !cfg.DisableAgent {
		if err := joinapi.ClaimServerNode(ctx, admin, cfg.Node.NodeName); err != nil {
			return err
		}
	}
	// The metrics API listens before the manifests register it with the
	// apiserver, which would otherwise report it unreachable.
	if !cfg.Disable.MetricsServer {
		if err := startMetrics(ctx, g, cfg, certs); err != nil {
			return err
		}
	}
	if err := startAddons(ctx, g, cfg, certs); err != nil {
		return err
	}
	if !single {
		// A piece of its own, since it may wait for a lease to go
		// unrenewed; it then idles until the server stops.
		hostname, _ := os.Hostname()
		if err := g.Go("leader leases", func(ctx context.Context) error {
			if err := releaseOwnLeases(ctx, admin, hostname, leaseHolderGone); err != nil && ctx.Err() == nil {
				log.WithError(err).Warn("the controller-manager and the scheduler wait for their previous leases to expire")
			}
			<-ctx.Done()
			return nil
		}); err != nil {
			return err
		}
	}
	if err := g.Start(controllermanager.Start(controllermanager.Config{
		Kubeconfig:     paths.ControllerManagerKubeconfig,
		ClusterCIDRs:   cfg.ClusterCIDRs,
		ServiceCIDRs:   cfg.ServiceCIDRs,
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
	if err := g.Go("node addresses", func(ctx context.Context) error { return nodeaddress.Run(ctx, admin) }); err != nil {
		return err
	}
	if m := store.Members(); m != nil {
		if err := g.Go("etcd members", func(ctx context.Context) error { return etcdmembers.Run(ctx, admin, m) }); err != nil {
			return err
		}
		if err := g.Go("etcd defrag", func(ctx context.Context) error { return datastore.Defrag(ctx, store.Backend()) }); err != nil {
			return err
		}
	}
	if !cfg.Disable.ServiceLB {
		if err := g.Go("servicelb", func(ctx context.Context) error { return servicelb.Run(ctx, admin) }); err != nil {
			return err
		}
	}
	if !cfg.Disable.HelmController {
		if err := startHelmController(g, cfg, !single); err != nil {
			return err
		}
	}
	if !cfg.Disable.Gateway {
		gc := gateway.ControllerConfig{Kubeconfig: paths.AdminKubeconfig, CRDs: embed.GatewayCRDs(), LeaderElection: !single, AddressRanges: cfg.GatewayAddressRanges}
		if err := g.Go("gateway controller", func(ctx context.Context) error { return gateway.RunController(ctx, gc) }); err != nil {
			return err
		}
	}
	if err := startUpgradeController(g, cfg, !single); err != nil {
		return err
	}
	if !cfg.Snapshots.Disabled && cfg.Datastore.Endpoint == "" {
		if err := g.Go("snapshots", func(ctx context.Context) error {
			return snapshot.Schedule(ctx, snapshot.ScheduleConfig{Snapshots: cfg.Snapshots, DataDir: cfg.DataDir, Node: cfg.NodeName, Events: admin})
		}); err != nil {
			return err
		}
	}
	if cfg.DisableAgent {
		return nil
	}
	k, err := agent.Start(ctx, g, cfg.Agent(), staged, agent.Credentials{Server: url, Files: certs.Node()})
	if err != nil {
		return err
	}
	if !single {
		if err := g.Go("CSI plugin", func(ctx context.Context) error { return reinitializeCSIPlugin(ctx, k) }); err != nil {
			return err
		}
	}
	log.WithFields(logrus.Fields{"node": cfg.NodeName, "took": time.Since(began).Round(time.Millisecond)}).Info("kelp node is running")
	return nil
}

// routes are kelp's own paths on the apiserver's port: the join API and,
// with the Helm controller, the charts it serves.
func routes(cfg config.Server, join joinapi.Config) map[string]http.Handler {
	r := joinapi.Routes(join)
	if !cfg.Disable.HelmController {
		maps.Copy(r, helmchart.Routes(layout.Server(cfg.DataDir).StaticCharts))
	}
	return r
}

func pkiConfig(cfg config.Server) pki.Config {
	var ips []net.IP
	// The kubernetes Service has an address of each family in a
	// dual-stack cluster; its primary one is ServiceIP.
	for _, ip := range slices.Concat(cfg.NodeIPs, []netip.Addr{cfg.AdvertiseAddress}, cfg.FirstServiceIPs()[1:]) {
		ips = append(ips, net.IP(ip.AsSlice()))
	}
	return pki.Config{
		SharedDatastore: !singleServer(cfg),
		Dir:             layout.Server(cfg.DataDir).TLS,
		Hostname:        cfg.NodeName,
		IPs:             ips,
		ExtraSANs:       cfg.TLSSANs,
		ServiceIP:       net.IP(cfg.FirstServiceIP().AsSlice()),
		ClusterDomain:   cfg.ClusterDomain,
	}
}

func datastoreConfig(cfg config.Server, certs pki.Files) datastore.Config {
	return datastore.Config{
		DataDir:     cfg.DataDir,
		Endpoint:    cfg.Datastore.Endpoint,
		CAFile:      cfg.Datastore.CAFile,
		CertFile:    cfg.Datastore.CertFile,
		KeyFile:     cfg.Datastore.KeyFile,
		ClusterInit: cfg.EmbeddedEtcd(),
		Name:        cfg.NodeName,
		AdvertiseIP: cfg.AdvertiseAddress.String(),
		EtcdTLS: datastore.EtcdTLS{
			ServerCA: certs.EtcdServerCA.Cert,
			Server:   certs.EtcdServer,
			PeerCA:   certs.EtcdPeerCA.Cert,
			Peer:     certs.EtcdPeer,
			Client:   certs.EtcdClient,
		},
	}
}

// anonymousPaths are all a request without credentials reaches: the
// join API's, which nodes call before they have any, and upstream's
// health and version endpoints.
func anonymousPaths() []string {
	return []string{
		joinapi.CACertsPath, joinapi.PingPath, joinapi.JoinPath, joinapi.ServerJoinPath,
		"/healthz", "/livez", "/readyz", "/version",
	}
}

// writeAPIServerFiles writes the apiserver's admission configuration, at
// the Pod Security the flag or the cluster's recorded default gives, its
// authentication configuration and,
// with an audit log but no policy of the user's, kelp's audit policy.
func writeAPIServerFiles(cfg config.Server) (apiserver.Audit, error) {
	paths := layout.Server(cfg.DataDir)
	ps, err := apiserver.ResolvePodSecurity(paths.PodSecurityDefault, cfg.PodSecurityDefault, madeEarlier(paths))
	if err != nil {
		return apiserver.Audit{}, err
	}
	if cfg.PodSecurityDefault == "" && ps.Enforce == "privileged" {
		log.Warn("Pod Security admission refuses no pod here: this cluster was made by an earlier kelp, whose default was upstream's privileged. " +
			"Refuse what baseline refuses, as a new cluster does, with --pod-security-default baseline on every server, once `kubectl label --dry-run=server --overwrite ns --all pod-security.kubernetes.io/enforce=baseline` warns of nothing you need " +
			"(a namespace that needs more: `kubectl label ns NAME pod-security.kubernetes.io/enforce=privileged`); --pod-security-default privileged keeps this and silences this warning")
	}
	if err := apiserver.WriteAdmissionConfig(paths.AdmissionConfig, ps); err != nil {
		return apiserver.Audit{}, err
	}
	if err := apiserver.WriteAuthenticationConfig(paths.AuthenticationConfig, anonymousPaths()); err != nil {
		return apiserver.Audit{}, err
	}
	a := cfg.Audit
	audit := apiserver.Audit{LogPath: a.LogPath, PolicyFile: a.PolicyFile, MaxSizeMB: a.MaxSizeMB, MaxBackups: a.MaxBackups, MaxAgeDays: a.MaxAgeDays}
	if a.LogPath == "" || a.PolicyFile != "" {
		return audit, nil
	}
	audit.PolicyFile = paths.AuditPolicy
	return audit, apiserver.WriteDefaultAuditPolicy(paths.AuditPolicy)
}

// madeEarlier says that the data dir holds a cluster whose server ran
// before this start, by the files an earlier kelp left there that a
// start writes only after it records its Pod Security default: the
// admission configuration, or the admin kubeconfig once the apiserver
// ran. (The certificates tell nothing here: this start has made them.)
func madeEarlier(paths layout.ServerPaths) bool {
	for _, f := range []string{paths.AdmissionConfig, paths.AdminKubeconfig} {
		if _, err := os.Stat(f); err == nil {
			return true
		}
	}
	return false
}

// secretsEncryption returns the encryption configuration the apiserver
// reads: made at the first start, encrypting unless
// --secrets-encryption=false; taken from the cluster by a joining server;
// kept once there, so that `kelp secrets-encrypt` changes it while the
// apiserver runs and reloads it. Given by the user on a cluster whose
// Secrets are in the clear, --secrets-encryption encrypts them on a single
// server (reencrypt: the Secrets are then rewritten once the apiserver
// runs), and refuses to start a server that shares its datastore, whose
// other servers must encrypt too.
func secretsEncryption(cfg config.Server, fromCluster []byte) (path string, reencrypt bool, err error) {
	paths := layout.Server(cfg.DataDir)
	path, pending := paths.EncryptionConfig, paths.ReencryptPending
	current, ok, err := secretsencrypt.Load(path)
	switch {
	case err != nil:
		return "", false, err
	case ok && cfg.SecretsEncryption && !current.Enabled && !cfg.SecretsEncryptionGiven:
		log.Warn("Secrets are stored in the clear in this cluster (made without --secrets-encryption, or before kelp encrypted them by default): " +
			"encrypt them with --secrets-encryption, or `kelp secrets-encrypt enable` and then `kelp secrets-encrypt reencrypt`; --secrets-encryption=false silences this")
	case ok && cfg.SecretsEncryption && !current.Enabled && !singleServer(cfg):
		return "", false, errors.New("--secrets-encryption: this cluster stores its Secrets in the clear, and its servers share the datastore, so all of them must encrypt: " +
			"start this server without --secrets-encryption, run `kelp secrets-encrypt enable` on every server, then `kelp secrets-encrypt reencrypt` on one")
	case ok && cfg.SecretsEncryption && !current.Enabled:
		// The mark comes first: once the key writes, a crash before every
		// Secret is rewritten must not leave some in the clear for good.
		if err := atomicfile.Write(pending, nil, 0o600); err != nil {
			return "", false, err
		}
		if err := secretsencrypt.Enable(path, time.Now()); err != nil {
			return "", false, err
		}
		log.Info("Encrypting the Secrets of this cluster (--secrets-encryption): new writes are encrypted, and the Secrets stored in the clear are rewritten once the apiserver runs")
	case ok:
	case len(fromCluster) > 0:
		if err = os.MkdirAll(filepath.Dir(path), 0o700); err == nil {
			err = atomicfile.Write(path, fromCluster, 0o600)
		}
	case cfg.SecretsEncryption:
		err = secretsencrypt.Enable(path, time.Now())
	default:
		err = secretsencrypt.Save(path, secretsencrypt.Config{})
	}
	_, statErr := os.Stat(pending)
	return path, statErr == nil, err
}

// reencryptSecrets rewrites the Secrets stored otherwise than with the key
// that writes, then removes the mark secretsEncryption left. A failure is
// logged and the mark kept, so that the next start tries again.
func reencryptSecrets(ctx context.Context, dataDir string, admin kubernetes.Interface, be datastore.Backend) {
	paths := layout.Server(dataDir)
	counts, err := secretsencrypt.Reencrypt(ctx, paths.EncryptionConfig, admin, be)
	if err == nil {
		err = os.Remove(paths.ReencryptPending)
	}
	if err != nil {
		if ctx.Err() == nil {
			log.WithError(err).Warn("Secrets are not all encrypted yet; the next start tries again, or run `kelp secrets-encrypt reencrypt`")
		}
		return
	}
	log.WithField("stored", counts).Info("Every Secret is stored encrypted")
}

// singleServer says the cluster has this one server: it keeps its state
// in SQLite.
func singleServer(cfg config.Server) bool {
	return cfg.Datastore.Endpoint == "" && !cfg.EmbeddedEtcd() && datastore.LocalKind(cfg.DataDir) != datastore.KindEtcd
}

// writeKubeconfigs writes the in-process clients' kubeconfigs and the
// admin's at --write-kubeconfig.
func writeKubeconfigs(cfg config.Server, url string, certs pki.Files) error {
	paths := layout.Server(cfg.DataDir)
	for _, f := range []struct {
		path string
		cert pki.Pair
	}{
		{paths.ControllerManagerKubeconfig, certs.ControllerManager},
		{paths.SchedulerKubeconfig, certs.Scheduler},
		{paths.AdminKubeconfig, certs.Admin},
	} {
		if err := kubeconfig.WriteLocal(f.path, kubeconfig.Client{Server: url, CAFile: certs.ServerCA.Cert, Cert: f.cert}); err != nil {
			return err
		}
	}
	admin := kubeconfig.Client{Server: url, CAFile: certs.ServerCA.Cert, Cert: certs.Admin}
	if err := kubeconfig.Write(cfg.WriteKubeconfig, cfg.WriteKubeconfigMode, admin); err != nil {
		return fmt.Errorf("%w (choose another path with --write-kubeconfig)", err)
	}
	return nil
}

func adminClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", kubeconfig, err)
	}
	return kubernetes.NewForConfig(rc)
}
