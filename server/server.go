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

	"github.com/kelp-dev/kelp/agent"
	"github.com/kelp-dev/kelp/embed"
	"github.com/kelp-dev/kelp/internal/apiserver"
	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/bootguard"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/helmchart"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/kubeconfig"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/profiling"
	"github.com/kelp-dev/kelp/internal/secretsencrypt"
	"github.com/kelp-dev/kelp/internal/version"
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
	e := &env{
		cfg:   cfg,
		paths: layout.Server(cfg.DataDir),
		url:   apiserver.LocalURL(cfg.BindAddress, cfg.HTTPSPort),
		local: datastore.LocalKind(cfg.DataDir),
	}
	if err := os.MkdirAll(e.paths.Dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", e.paths.Dir, err)
	}
	if err := version.CheckDataDir(e.paths.Versions, version.Ran{Kelp: version.Version, Kubernetes: version.Kubernetes()}); err != nil {
		return err
	}
	// The control plane itself needs nothing from the bundle; staging it
	// here means the node that will run beside it finds runc, the CNI
	// plugins and the pause image in place.
	var err error
	if e.staged, err = embed.Stage(cfg.DataDir); err != nil {
		return err
	}
	log.WithField("dir", e.staged.Dir).Debug("bundle staged")
	cluster, err := joinCluster(ctx, cfg, e.local)
	if err != nil {
		return err
	}
	e.pki = pkiConfig(cfg, e.local)
	if e.certs, err = pki.Ensure(e.pki); err != nil {
		return err
	}
	tokens, err := ensureTokens(cfg, e.certs, cluster.agentToken)
	if err != nil {
		return err
	}
	// Before any client is made: a test's short-lived certificates make
	// the clients look for renewed ones more often.
	if e.leafLifetime, err = testLeafLifetime(); err != nil {
		return err
	}
	if e.admin, err = adminClients(e.url, e.certs); err != nil {
		return err
	}

	audit, err := writeAPIServerFiles(cfg, e.paths)
	if err != nil {
		return err
	}
	var encryption string
	if encryption, e.reencrypt, err = secretsEncryption(cfg, e.paths, singleServer(cfg, e.local), cluster.encryptionConfig); err != nil {
		return err
	}
	if err := beforeDatastore(ctx, cfg, guard, e.local); err != nil {
		return err
	}
	if err := migrateToEtcd(ctx, cfg, e.certs, e.local); err != nil {
		return err
	}
	dc := datastoreConfig(cfg, e.certs)
	dc.InitialCluster = cluster.initialCluster
	store, err := datastore.Start(ctx, dc)
	if err := g.Start(store, err); err != nil {
		return err
	}
	e.store = store
	if err := snapshotEtcd(ctx, cfg, guard, e.store.Backend().Kind); err != nil {
		return err
	}
	// With one server, its RAM store is the only copy of the leases, so
	// it is as consistent as the datastore; on etcd or an external
	// datastore, which other servers share, it would not be.
	var ram datastore.Backend
	if e.single() && !cfg.DisableRAMStore {
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
		Certs:                    e.certs,
		Storage:                  e.store.Backend(),
		RAMStorage:               ram,
		SingleServer:             e.single(),
		Audit:                    audit,
		AdmissionConfigFile:      e.paths.AdmissionConfig,
		AuthenticationConfigFile: e.paths.AuthenticationConfig,
		EncryptionConfigFile:     encryption,
		ExtraArgs:                cfg.ExtraArgs.APIServer,
		ForeignWrites:            guard.WriteWatch(),
	}, routes(e, tokens))); err != nil {
		return err
	}
	if err := writeKubeconfigs(e); err != nil {
		return err
	}
	if err := startCertRenewal(ctx, g, e); err != nil {
		return err
	}
	if err := startParts(ctx, g, e, controlPlane()); err != nil {
		return err
	}
	log.WithFields(logrus.Fields{"datastore": e.store.Backend().Kind, "kubeconfig": cfg.WriteKubeconfig, "took": time.Since(began).Round(time.Millisecond)}).
		Info("kelp server is ready")
	if err := startParts(ctx, g, e, controllers()); err != nil {
		return err
	}
	if cfg.DisableAgent {
		return nil
	}
	k, err := agent.Start(ctx, g, cfg.Agent(), e.staged, agent.Credentials{Server: e.url, Files: e.certs.Node()})
	if err != nil {
		return err
	}
	if !e.single() {
		if err := g.Go("CSI plugin", func(ctx context.Context) error { return reinitializeCSIPlugin(ctx, k) }); err != nil {
			return err
		}
	}
	log.WithFields(logrus.Fields{"node": cfg.NodeName, "took": time.Since(began).Round(time.Millisecond)}).Info("kelp node is running")
	return nil
}

// routes are kelp's own paths on the apiserver's port: the join API and,
// with the Helm controller, the charts it serves.
func routes(e *env, tokens tokenFiles) map[string]http.Handler {
	// A nil *Members in the interface would look like a member list.
	var members joinapi.Members
	if m := e.store.Members(); m != nil {
		members = m
	}
	r := joinapi.Routes(joinapi.Config{
		Certs:                e.certs,
		TokenFile:            tokens.server,
		AgentTokenFile:       tokens.agent,
		Admin:                e.admin.kube,
		Agent:                agentConfig(e.cfg),
		Datastore:            e.store.Backend().Kind,
		Members:              members,
		EncryptionConfigFile: e.paths.EncryptionConfig,
	})
	if helmController(e) {
		maps.Copy(r, helmchart.Routes(e.paths.StaticCharts))
	}
	return r
}

// pkiConfig is what the server's certificates are made of; local is the
// kind of datastore the data dir holds (datastore.LocalKind).
func pkiConfig(cfg config.Server, local string) pki.Config {
	var ips []net.IP
	// The kubernetes Service has an address of each family in a
	// dual-stack cluster; its primary one is ServiceIP.
	for _, ip := range slices.Concat(cfg.NodeIPs, []netip.Addr{cfg.AdvertiseAddress}, cfg.FirstServiceIPs()[1:]) {
		ips = append(ips, net.IP(ip.AsSlice()))
	}
	return pki.Config{
		SharedDatastore: !singleServer(cfg, local),
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
		joinapi.CACertsPath, joinapi.PingPath, joinapi.JoinPath, joinapi.ServerJoinPath, joinapi.WitnessJoinPath,
		"/healthz", "/livez", "/readyz", "/version",
	}
}

// writeAPIServerFiles writes the apiserver's admission configuration, at
// the Pod Security the flag or the cluster's recorded default gives, its
// authentication configuration and,
// with an audit log but no policy of the user's, kelp's audit policy.
func writeAPIServerFiles(cfg config.Server, paths layout.ServerPaths) (apiserver.Audit, error) {
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
func secretsEncryption(cfg config.Server, paths layout.ServerPaths, single bool, fromCluster []byte) (path string, reencrypt bool, err error) {
	path, pending := paths.EncryptionConfig, paths.ReencryptPending
	current, ok, err := secretsencrypt.Load(path)
	switch {
	case err != nil:
		return "", false, err
	case ok && cfg.SecretsEncryption && !current.Enabled && !cfg.SecretsEncryptionGiven:
		log.Warn("Secrets are stored in the clear in this cluster (made without --secrets-encryption, or before kelp encrypted them by default): " +
			"encrypt them with --secrets-encryption, or `kelp secrets-encrypt enable` and then `kelp secrets-encrypt reencrypt`; --secrets-encryption=false silences this")
	case ok && cfg.SecretsEncryption && !current.Enabled && !single:
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
func reencryptSecrets(ctx context.Context, paths layout.ServerPaths, admin kubernetes.Interface, be datastore.Backend) {
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
// in SQLite. local is the kind of datastore the data dir holds
// (datastore.LocalKind). Once the datastore runs, env.single says so.
func singleServer(cfg config.Server, local string) bool {
	return cfg.Datastore.Endpoint == "" && !cfg.EmbeddedEtcd() && local != datastore.KindEtcd
}

// writeKubeconfigs writes the in-process clients' kubeconfigs and the
// admin's at --write-kubeconfig.
func writeKubeconfigs(e *env) error {
	for _, f := range []struct {
		path string
		cert pki.Pair
	}{
		{e.paths.ControllerManagerKubeconfig, e.certs.ControllerManager},
		{e.paths.SchedulerKubeconfig, e.certs.Scheduler},
		{e.paths.AdminKubeconfig, e.certs.Admin},
	} {
		if err := kubeconfig.WriteLocal(f.path, kubeconfig.Client{Server: e.url, CAFile: e.certs.ServerCA.Cert, Cert: f.cert}); err != nil {
			return err
		}
	}
	admin := kubeconfig.Client{Server: e.url, CAFile: e.certs.ServerCA.Cert, Cert: e.certs.Admin}
	if err := kubeconfig.Write(e.cfg.WriteKubeconfig, e.cfg.WriteKubeconfigMode, admin); err != nil {
		return fmt.Errorf("%w (choose another path with --write-kubeconfig)", err)
	}
	return nil
}
