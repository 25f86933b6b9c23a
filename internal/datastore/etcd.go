package datastore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const (
	etcdDirName = "etcd"
	// etcdStopTimeout bounds embed.Etcd.Close, which has no deadline of its
	// own beyond its request timeout for draining clients.
	etcdStopTimeout = 30 * time.Second
	// etcdSnapshotCount is how many applied entries etcd keeps in memory
	// between snapshots; the default of 10000 (3.6+) is meant for bigger
	// machines than a Raspberry Pi.
	etcdSnapshotCount = 5000
	// etcdQuotaBytes is etcd's default 2 GiB, set here so that it is a
	// decision: it is a ceiling, not a reservation, and a cluster that hits
	// it goes read-only, so smaller is not better on small machines.
	etcdQuotaBytes = 2 << 30
)

// etcdEngine is an embedded etcd member.
type etcdEngine struct {
	etcd     *embed.Etcd
	lock     *dirLock
	failc    chan error
	stopping chan struct{}
	// closing tells the logger that listener errors are part of Close.
	closing *atomic.Bool
	// removed is set by the logger when etcd stops because the cluster
	// removed this member.
	removed *atomic.Bool
	dir     string
	// stopMembership ends the learner promotion and the peer URL update.
	stopMembership context.CancelFunc
}

func startEtcd(cfg Config, log *logrus.Entry) (_ engine, desc string, _ Backend, rerr error) {
	dbDir, err := cfg.dbDir()
	if err != nil {
		return nil, "", Backend{}, err
	}
	dir := filepath.Join(dbDir, etcdDirName)
	desc = "embedded etcd " + dir

	t := cfg.EtcdTLS
	for _, f := range []string{t.ServerCA, t.Server.Cert, t.Server.Key, t.PeerCA, t.Peer.Cert, t.Peer.Key, t.Client.Cert, t.Client.Key} {
		if _, err := os.Stat(f); err != nil {
			return nil, "", Backend{}, fmt.Errorf("%s: TLS file: %w: the server certificates must exist before etcd starts", desc, err)
		}
	}
	if err := makePrivateDir(dir); err != nil {
		return nil, "", Backend{}, fmt.Errorf("%s: %w", desc, err)
	}
	lock, err := lockDir(dbDir)
	if err != nil {
		return nil, "", Backend{}, err
	}
	defer func() {
		if rerr != nil {
			lock.release()
		}
	}()

	if err := checkEtcdBackend(dir); err != nil {
		return nil, "", Backend{}, err
	}
	// An empty cluster beside the old data would look like lost data: the
	// server migrates it first (server.migrateToEtcd) unless it joins
	// another cluster.
	if sqlitePath := filepath.Join(dbDir, stateDBName); !wal.Exist(filepath.Join(dir, "member", "wal")) && nonEmpty(sqlitePath) {
		return nil, "", Backend{}, fmt.Errorf("%s: this server holds a cluster of its own in the SQLite datastore %s: start it with --cluster-init and without --server to move that cluster to etcd, or move the file away to join another cluster", desc, sqlitePath)
	}
	closing, removed := &atomic.Bool{}, &atomic.Bool{}
	ec, err := etcdConfig(cfg, dir, log, closing, removed)
	if err != nil {
		return nil, "", Backend{}, fmt.Errorf("%s: %w", desc, err)
	}
	// StartEtcd opens the backend and replays the WAL before it returns, and
	// closes whatever it started when it fails.
	e, err := embed.StartEtcd(ec)
	if err != nil && removed.Load() {
		return nil, "", Backend{}, errMemberRemoved(dir)
	}
	if err != nil {
		hint := "check the etcd messages logged above"
		if errors.Is(err, syscall.EADDRINUSE) {
			hint = "another etcd or kelp server is using the port"
		} else if errors.Is(err, syscall.EADDRNOTAVAIL) {
			hint = "the advertise address must be an address of this host"
		}
		return nil, "", Backend{}, fmt.Errorf("%s: %w: %s", desc, err, hint)
	}

	clientPort := orDefault(cfg.clientPort, defaultEtcdClientPort)
	be := Backend{
		Endpoints: []string{"https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(clientPort))},
		CAFile:    cfg.EtcdTLS.ServerCA,
		CertFile:  cfg.EtcdTLS.Client.Cert,
		KeyFile:   cfg.EtcdTLS.Client.Key,
	}
	membershipCtx, stopMembership := context.WithCancel(context.Background())
	s := &etcdEngine{etcd: e, lock: lock, failc: make(chan error, 1), stopping: make(chan struct{}), closing: closing, removed: removed, dir: dir, stopMembership: stopMembership}
	go s.watch()
	go promoteLearners(membershipCtx, be, log)
	go updatePeerURLs(membershipCtx, e, log)
	return s, desc, be, nil
}

func etcdConfig(cfg Config, dir string, log *logrus.Entry, closing, removed *atomic.Bool) (*embed.Config, error) {
	name := cfg.Name
	if name == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("etcd member name: %w", err)
		}
		name = host
	}
	advertise := orDefault(cfg.AdvertiseIP, "127.0.0.1")
	clientPort := strconv.Itoa(orDefault(cfg.clientPort, defaultEtcdClientPort))
	peerPort := strconv.Itoa(orDefault(cfg.peerPort, defaultEtcdPeerPort))
	httpsURL := func(host, port string) url.URL {
		return url.URL{Scheme: "https", Host: net.JoinHostPort(host, port)}
	}

	ec := embed.NewConfig()
	ec.Name = name
	ec.Dir = dir
	ec.InitialClusterToken = "kelp"

	ec.ListenClientUrls = []url.URL{httpsURL("127.0.0.1", clientPort)}
	ec.AdvertiseClientUrls = ec.ListenClientUrls
	if ip := net.ParseIP(advertise); !ip.IsLoopback() && !cfg.Witness {
		ec.ListenClientUrls = append(ec.ListenClientUrls, httpsURL(advertise, clientPort))
		ec.AdvertiseClientUrls = []url.URL{httpsURL(advertise, clientPort)}
	}
	ec.ListenPeerUrls = []url.URL{httpsURL(advertise, peerPort)}
	ec.AdvertisePeerUrls = ec.ListenPeerUrls
	ec.InitialCluster = ec.InitialClusterFromName(name)
	// A member with a WAL restarts from it; saying "existing" makes sure it
	// never bootstraps a second, new cluster over its own data.
	ec.ClusterState = embed.ClusterStateFlagNew
	hasData := wal.Exist(filepath.Join(dir, "member", "wal"))
	switch {
	case hasData:
		ec.ClusterState = embed.ClusterStateFlagExisting
	case cfg.InitialCluster != "":
		ec.ClusterState = embed.ClusterStateFlagExisting
		ec.InitialCluster = cfg.InitialCluster
	}
	if cfg.ForceNewCluster {
		if !hasData {
			return nil, fmt.Errorf("--cluster-reset: %s holds no etcd member to reset", dir)
		}
		ec.ForceNewCluster = true
	}

	ec.ClientTLSInfo = transport.TLSInfo{
		CertFile:       cfg.EtcdTLS.Server.Cert,
		KeyFile:        cfg.EtcdTLS.Server.Key,
		TrustedCAFile:  cfg.EtcdTLS.ServerCA,
		ClientCertAuth: true,
	}
	ec.PeerTLSInfo = transport.TLSInfo{
		CertFile:       cfg.EtcdTLS.Peer.Cert,
		KeyFile:        cfg.EtcdTLS.Peer.Key,
		TrustedCAFile:  cfg.EtcdTLS.PeerCA,
		ClientCertAuth: true,
	}

	ec.SnapshotCount = etcdSnapshotCount
	ec.QuotaBackendBytes = etcdQuotaBytes
	// Only the apiserver talks to etcd, over gRPC: no HTTP/JSON gateway.
	ec.EnableGRPCGateway = false

	ec.Logger = "zap"
	ec.LogLevel = "warn"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(&logrusCore{
		LevelEnabler: zapcore.WarnLevel,
		entry:        log.WithField("backend", "etcd"),
		closing:      closing,
		removed:      removed,
	}))
	return ec, nil
}

// checkEtcdBackend refuses a bbolt file that does not open. etcd opens it in
// a goroutine of its own and panics when it cannot, which no caller can
// recover from; a read-only open checks the meta pages without writing.
func checkEtcdBackend(dir string) error {
	path := filepath.Join(dir, "member", "snap", "db")
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("embedded etcd database %s cannot be opened (%v): restore it from an etcd snapshot, or move %s away to start an empty cluster; kelp has not changed it", path, err, dir)
	}
	return db.Close()
}

// watch reports etcd stopping on its own: a listener that failed, or the
// server leaving the raft loop.
func (s *etcdEngine) watch() {
	var err error
	select {
	case e, ok := <-s.etcd.Err():
		if !ok || e == nil {
			e = errors.New("etcd stopped serving")
		}
		err = e
	case <-s.etcd.Server.StopNotify():
		err = errors.New("etcd server stopped")
	case <-s.stopping:
		return
	}
	if s.removed.Load() {
		err = errMemberRemoved(s.dir)
	}
	select {
	case <-s.stopping:
	default:
		s.failc <- err
	}
}

func (s *etcdEngine) failed() <-chan error { return s.failc }

// stop closes etcd: it drains clients, stops raft, syncs and closes the WAL
// and the bbolt backend, and closes its listeners. The lock is kept if etcd
// does not stop: it may still write.
func (s *etcdEngine) stop() error {
	close(s.stopping)
	s.stopMembership()
	s.closing.Store(true)
	done := make(chan struct{})
	go func() {
		s.etcd.Close()
		close(done)
	}()
	select {
	case <-done:
		s.lock.release()
		return nil
	case <-time.After(etcdStopTimeout):
		return fmt.Errorf("etcd did not stop within %s", etcdStopTimeout)
	}
}

// logrusCore is a zapcore.Core that writes etcd's log entries to logrus.
type logrusCore struct {
	zapcore.LevelEnabler
	entry   *logrus.Entry
	fields  []zapcore.Field
	closing *atomic.Bool
	removed *atomic.Bool
}

func (c *logrusCore) With(fields []zapcore.Field) zapcore.Core {
	clone := *c
	clone.fields = append(append([]zapcore.Field(nil), c.fields...), fields...)
	return &clone
}

func (c *logrusCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) && !quietEtcdMessages[e.Message] {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *logrusCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	if e.Message == memberRemovedMessage {
		c.removed.Store(true)
	}
	level := logrus.ErrorLevel
	switch e.Level {
	case zapcore.DebugLevel:
		level = logrus.DebugLevel
	case zapcore.InfoLevel:
		level = logrus.InfoLevel
	case zapcore.WarnLevel:
		level = logrus.WarnLevel
	}
	// Close shuts etcd's listeners under its serving goroutines, which log
	// that as errors.
	if c.closing.Load() {
		if msg, _ := enc.Fields["error"].(string); strings.Contains(msg, "use of closed network connection") || strings.Contains(msg, "Server closed") {
			level = logrus.DebugLevel
		}
	}
	c.entry.WithFields(enc.Fields).Log(level, e.Message)
	return nil
}

func (c *logrusCore) Sync() error { return nil }

// errMemberRemoved says what to do with a member the cluster removed.
func errMemberRemoved(dir string) error {
	return fmt.Errorf("this server was removed from the etcd cluster (kubectl delete node): "+
		"to make it a server again, move %s away and start it with --server and --token of a server still in the cluster", dir)
}

// memberRemovedMessage is what etcd logs when it stops because the cluster
// removed this member; etcd reports no error kelp could read instead.
const memberRemovedMessage = "data-dir used by this member must be removed"

// quietEtcdMessages are warnings etcd logs on every start of a healthy
// single-node setup; they tell a kelp operator nothing.
var quietEtcdMessages = map[string]bool{
	"Running http and grpc server on single port. This is not recommended for production.": true,
	// Tokens are only used with etcd's own auth, which kelp leaves off.
	"simple token is not cryptographically signed": true,
}
