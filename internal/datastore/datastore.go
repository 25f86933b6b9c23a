package datastore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
)

const (
	// remoteConnectTimeout bounds how long Start waits for a PostgreSQL or
	// MySQL server to accept the connection.
	remoteConnectTimeout = 30 * time.Second
	// readyTimeout bounds how long the backend may take to answer its first
	// etcd request after Start; after that the datastore is reported failed.
	readyTimeout = 30 * time.Second
	// joinReadyTimeout replaces it for a member joining a cluster: it is
	// ready once promoted, after it caught up with the leader.
	joinReadyTimeout = 2 * time.Minute
	// probeAttemptTimeout bounds one readiness request.
	probeAttemptTimeout = 5 * time.Second
	probeInterval       = 500 * time.Millisecond

	defaultEtcdClientPort = 2379
	defaultEtcdPeerPort   = 2380
)

// Config says which datastore to run. Start validates it and never changes it.
type Config struct {
	// DataDir is kelp's --data-dir. SQLite lives at <DataDir>/server/db/state.db,
	// embedded etcd at <DataDir>/server/db/etcd.
	DataDir string
	// Endpoint is --datastore-endpoint: "" for SQLite, postgres://..., mysql://...,
	// or https://host:2379[,https://...] for an external etcd.
	Endpoint string
	// CAFile, CertFile and KeyFile are --datastore-cafile/certfile/keyfile: TLS
	// to an external datastore.
	CAFile, CertFile, KeyFile string
	// ClusterInit runs an embedded etcd: --cluster-init on the first
	// server, or a server that joins one.
	ClusterInit bool
	// InitialCluster is etcd's --initial-cluster for a server joining an
	// embedded etcd cluster, "name=peerURL,…" as the server it joined
	// through added it. It is used only while the member has no data yet.
	InitialCluster string
	// ForceNewCluster is --cluster-reset: the member makes itself the only
	// one of its cluster, keeping its data.
	ForceNewCluster bool
	// Name is the etcd member name, normally the node's hostname; empty means
	// the hostname.
	Name string
	// AdvertiseIP is the address etcd peers reach this member on; empty means
	// 127.0.0.1.
	AdvertiseIP string
	// EtcdTLS holds the certificates for embedded etcd.
	EtcdTLS EtcdTLS
	// DBDir is where the datastore keeps its files; empty means
	// <DataDir>/server/db. A witness keeps its etcd member elsewhere.
	DBDir string
	// Witness runs the embedded etcd member of a witness (`kelp witness`):
	// its client port is served and advertised on 127.0.0.1 only, as no
	// apiserver uses it and other machines have no business there, and it
	// waits for its cluster's quorum for as long as it runs instead of
	// failing when none answers within the ready timeout: without one it
	// has nothing to do but wait.
	Witness bool

	// Test-only overrides; zero means the production default.
	clientPort     int           // embedded etcd client port (2379)
	peerPort       int           // embedded etcd peer port (2380)
	connectTimeout time.Duration // remoteConnectTimeout
	readyTimeout   time.Duration // readyTimeout
	runDir         string        // where the kine socket goes when the data dir path is too long (/run/kelp)
}

// EtcdTLS holds certificate and key files for embedded etcd. The client
// endpoint requires client certificates signed by ServerCA; peers
// authenticate each other with certificates signed by PeerCA. The apiserver
// connects with Client.
type EtcdTLS struct {
	ServerCA string
	Server   pki.Pair // serving, and client to itself
	PeerCA   string
	Peer     pki.Pair
	Client   pki.Pair
}

// Backend is what kube-apiserver needs to reach the datastore: its
// --etcd-servers and TLS files (empty when the connection is not TLS).
type Backend struct {
	Endpoints                 []string
	CAFile, CertFile, KeyFile string
	// Kind is one of KindSQLite, KindEtcd, KindPostgres, KindMySQL or
	// KindExternalEtcd, for logs.
	Kind string
}

// Validate checks the configuration without touching the file system.
func (c Config) Validate() error {
	kind, err := endpointKind(c.Endpoint)
	if err != nil {
		return err
	}
	if c.ClusterInit && c.Endpoint != "" {
		return fmt.Errorf("--cluster-init starts an embedded etcd and cannot be combined with --datastore-endpoint %q: use one or the other", Redact(c.Endpoint))
	}
	if c.ClusterInit {
		kind = KindEtcd
	}
	if kind != KindExternalEtcd && c.DataDir == "" {
		return errors.New("datastore: no data directory given (--data-dir)")
	}
	if (c.CAFile != "" || c.CertFile != "" || c.KeyFile != "") && c.Endpoint == "" {
		return errors.New("--datastore-cafile, --datastore-certfile and --datastore-keyfile are only used with --datastore-endpoint: remove them or set the endpoint")
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("--datastore-certfile and --datastore-keyfile must be given together")
	}
	if kind == KindEtcd {
		if c.AdvertiseIP != "" && net.ParseIP(c.AdvertiseIP) == nil {
			return fmt.Errorf("etcd advertise address %q is not an IP address", c.AdvertiseIP)
		}
		t := c.EtcdTLS
		for _, f := range []struct{ name, path string }{
			{"server CA", t.ServerCA}, {"server certificate", t.Server.Cert}, {"server key", t.Server.Key},
			{"peer CA", t.PeerCA}, {"peer certificate", t.Peer.Cert}, {"peer key", t.Peer.Key},
			{"client certificate", t.Client.Cert}, {"client key", t.Client.Key},
		} {
			if f.path == "" {
				return fmt.Errorf("embedded etcd needs its %s file: none given", f.name)
			}
		}
	}
	return nil
}

func (c Config) kind() string {
	if c.ClusterInit {
		return KindEtcd
	}
	kind, _ := endpointKind(c.Endpoint)
	return kind
}

func (c Config) dbDir() (string, error) {
	if c.DBDir != "" {
		abs, err := filepath.Abs(c.DBDir)
		if err != nil {
			return "", fmt.Errorf("datastore: resolve %s: %w", c.DBDir, err)
		}
		return abs, nil
	}
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return "", fmt.Errorf("datastore: resolve --data-dir %s: %w", c.DataDir, err)
	}
	return layout.Server(abs).DB, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// engine is one running backend.
type engine interface {
	// failed delivers at most one error if the backend stops on its own; a
	// nil channel means the backend has no way to tell.
	failed() <-chan error
	// stop stops the backend and releases what it holds. It returns in
	// bounded time, though that bound is the backend's, not the caller's.
	stop() error
}

var (
	_ component.Component = (*Datastore)(nil)
	_ engine              = (*kineEngine)(nil)
	_ engine              = (*etcdEngine)(nil)
	_ engine              = externalEtcd{}
)

// Datastore is a running datastore. Its methods are safe for concurrent use.
type Datastore struct {
	name         string // in the server's lifecycle
	desc         string // names the datastore in messages, without secrets
	backend      Backend
	eng          engine
	log          *logrus.Entry
	readyTimeout time.Duration

	ready chan struct{} // closed once the backend answered

	failOnce sync.Once
	failc    chan struct{} // closed on failure, after failErr is set
	failErr  error
	errc     chan error

	probeCancel context.CancelFunc
	probeDone   chan struct{}

	closeOnce sync.Once
	stopping  chan struct{}
	done      chan struct{} // closed when stopped, after closeErr is set
	closeErr  error

	// joins serializes Members.AddLearner: two servers asking at once
	// would both find no learner and both be added.
	joins sync.Mutex
}

// Start launches the datastore described by cfg and returns once it has
// launched; Ready and WaitReady tell when it answers. ctx bounds the checks
// and the connection to a remote database, not embedded etcd's own start,
// which cannot be interrupted; once started, the datastore runs until Stop.
// On error everything Start began is stopped again and nothing on disk has
// been removed or rewritten.
func Start(ctx context.Context, cfg Config) (*Datastore, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := logrus.WithField("component", "datastore")
	kind := cfg.kind()

	var (
		eng  engine
		desc string
		be   Backend
		err  error
	)
	switch kind {
	case KindSQLite, KindPostgres, KindMySQL:
		eng, desc, be, err = startKine(ctx, cfg, kind, log)
	case KindEtcd:
		eng, desc, be, err = startEtcd(cfg, log)
	case KindExternalEtcd:
		eng, desc, be, err = startExternalEtcd(cfg)
	}
	if err != nil {
		return nil, err
	}
	be.Kind = kind

	timeout := orDefault(cfg.readyTimeout, readyTimeout)
	if cfg.InitialCluster != "" {
		timeout = max(timeout, joinReadyTimeout)
	}
	if cfg.Witness {
		timeout = 0
	}
	return newDatastore("datastore", desc, eng, be, timeout, log), nil
}

// newDatastore watches and probes the running backend eng, which be
// reaches, for up to timeout; 0: until it answers or is stopped.
func newDatastore(name, desc string, eng engine, be Backend, timeout time.Duration, log *logrus.Entry) *Datastore {
	probeCtx, probeCancel := probeContext(timeout)
	d := &Datastore{
		name:         name,
		desc:         desc,
		backend:      be,
		eng:          eng,
		log:          log,
		readyTimeout: timeout,
		ready:        make(chan struct{}),
		failc:        make(chan struct{}),
		errc:         make(chan error, 1),
		probeCancel:  probeCancel,
		probeDone:    make(chan struct{}),
		stopping:     make(chan struct{}),
		done:         make(chan struct{}),
	}
	go d.watch()
	go d.probe(probeCtx)
	log.WithField("endpoints", be.Endpoints).Infof("Started %s", desc)
	return d
}

// probeContext bounds the readiness probe by timeout; 0: by Stop alone.
func probeContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout == 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), timeout)
}

// Backend returns how kube-apiserver reaches the datastore.
func (d *Datastore) Backend() Backend {
	be := d.backend
	be.Endpoints = append([]string(nil), be.Endpoints...)
	return be
}

// Ready is closed once the backend has answered an etcd request through the
// Backend endpoints. It is never closed if the datastore fails or is closed first.
func (d *Datastore) Ready() <-chan struct{} { return d.ready }

// WaitReady blocks until the backend answers an etcd request through the
// Backend endpoints. It fails if ctx ends, if the datastore fails or is
// closed, or if the backend has not answered within 30 s of Start (a
// witness waits as long as it runs: Config.Witness).
func (d *Datastore) WaitReady(ctx context.Context) error {
	select {
	case <-d.ready:
		return nil
	default:
	}
	select {
	case <-d.ready:
		return nil
	case <-d.failc:
		return d.failErr
	case <-d.stopping:
		return fmt.Errorf("%s was stopped before it became ready", d.desc)
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", d.desc, ctx.Err())
	}
}

// Err delivers at most one error if the datastore fails after Start,
// including when it never becomes ready. It is never closed.
func (d *Datastore) Err() <-chan error { return d.errc }

// Name names the datastore in the server's lifecycle: "datastore", or
// "ram store".
func (d *Datastore) Name() string { return d.name }

// Stop stops the datastore: kine's gRPC server and database connections, or
// embedded etcd. It is idempotent and safe to call concurrently; every call
// waits for the same shutdown and returns its result, or an error once ctx
// ends while the shutdown carries on in the background.
func (d *Datastore) Stop(ctx context.Context) error {
	d.closeOnce.Do(func() {
		close(d.stopping)
		go func() {
			d.probeCancel()
			<-d.probeDone
			d.closeErr = d.eng.stop()
			if d.closeErr == nil {
				d.log.Infof("Stopped %s", d.desc)
			}
			close(d.done)
		}()
	})
	select {
	case <-d.done:
		return d.closeErr
	case <-ctx.Done():
		return fmt.Errorf("%s did not stop in time: %w", d.desc, ctx.Err())
	}
}

// fail records the datastore's failure; Err and WaitReady report it, so it
// is not logged here as well.
func (d *Datastore) fail(err error) {
	d.failOnce.Do(func() {
		d.failErr = err
		close(d.failc)
		d.errc <- err
	})
}

// watch turns a backend's own failure into a datastore failure, unless the
// backend is stopping because Stop asked it to.
func (d *Datastore) watch() {
	select {
	case err, ok := <-d.eng.failed():
		if !ok || err == nil {
			err = errors.New("stopped unexpectedly")
		}
		select {
		case <-d.stopping:
		default:
			d.fail(fmt.Errorf("%s: %w", d.desc, err))
		}
	case <-d.stopping:
	}
}

// probe asks the backend for a key through the Backend endpoints, the way
// kube-apiserver will, until it answers or ctx ends.
func (d *Datastore) probe(ctx context.Context) {
	defer close(d.probeDone)
	err := d.probeOnce(ctx)
	select {
	case <-d.stopping:
		return
	default:
	}
	if err != nil {
		d.fail(err)
		return
	}
	close(d.ready)
	d.log.Infof("%s is ready", d.desc)
}

func (d *Datastore) probeOnce(ctx context.Context) error {
	cli, err := newClient(d.backend)
	if err != nil {
		return fmt.Errorf("%s: %w", d.desc, err)
	}
	defer cli.Close()
	for {
		attempt, cancel := context.WithTimeout(ctx, probeAttemptTimeout)
		_, err = cli.Get(attempt, "/kelp/datastore-probe", clientv3.WithCountOnly())
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			if why := dialErrors(d.backend.Endpoints); why != "" {
				err = fmt.Errorf("%w (%s)", err, why)
			}
			return fmt.Errorf("%s did not answer within %s: %w: %s", d.desc, d.readyTimeout, err, notReadyHint(d.backend.Kind))
		case <-time.After(probeInterval):
		}
	}
}

// dialErrors says which TCP endpoints refuse connections: a timed-out etcd
// request does not tell.
func dialErrors(endpoints []string) string {
	var errs []string
	for _, ep := range endpoints {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			continue
		}
		conn, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		conn.Close()
	}
	return strings.Join(errs, "; ")
}

func notReadyHint(kind string) string {
	switch kind {
	case KindExternalEtcd:
		return "check that etcd is running and reachable from this host, and that --datastore-cafile, --datastore-certfile and --datastore-keyfile match its certificates"
	case KindEtcd:
		return "check the etcd warnings logged above; a member restored from another cluster or a stale peer address keeps etcd from electing a leader"
	default:
		return "check the datastore messages logged above"
	}
}

// newClient returns an etcd client for the backend, with the TLS files the
// apiserver will use.
func newClient(be Backend) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   be.Endpoints,
		DialTimeout: probeAttemptTimeout,
		Logger:      zap.NewNop(),
	}
	if be.CAFile != "" || be.CertFile != "" {
		info := transport.TLSInfo{TrustedCAFile: be.CAFile, CertFile: be.CertFile, KeyFile: be.KeyFile}
		tlsCfg, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("load client TLS files: %w", err)
		}
		cfg.TLS = tlsCfg
	}
	for _, ep := range be.Endpoints {
		if cfg.TLS == nil && strings.HasPrefix(ep, "https://") {
			cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		}
	}
	return clientv3.New(cfg)
}
