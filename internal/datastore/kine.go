package datastore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/k3s-io/kine/pkg/drivers/generic"
	"github.com/k3s-io/kine/pkg/endpoint"
	kinetls "github.com/k3s-io/kine/pkg/tls"
	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/server/v3/storage/wal"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/layout"
)

const (
	stateDBName    = "state.db"
	kineSocketName = "kine.sock"
	// maxSocketPath is the longest path a unix socket can bind to on Linux:
	// sun_path holds 108 bytes including the terminating NUL.
	maxSocketPath = 107
	// kineStopTimeout bounds the wait for kine's goroutines after its context
	// ends; kine itself gives its gRPC server 2 s to drain.
	kineStopTimeout = 15 * time.Second
	// sqliteParams are kine's sqlite.DefaultParams but synchronous=FULL, and
	// no startup VACUUM. With WAL, NORMAL syncs the WAL only at checkpoints,
	// so a power loss or kernel crash can take back commits the apiserver
	// has acknowledged; FULL syncs the WAL at every commit. kine would
	// VACUUM, i.e. rewrite, the whole database at every start: needless
	// flash wear and a slow start on a big database, while SQLite reuses
	// free pages anyway. journal_size_limit truncates the WAL back to
	// 16 MiB after a checkpoint: it otherwise stays at the largest size a
	// burst of writes gave it (320 MiB after 10k creates). The pure-Go
	// driver kelp builds with passes _pragma through.
	sqliteParams = "_journal_mode=WAL&_busy_timeout=30000&_synchronous=FULL&_txlock=immediate&_stmt_cache_size=20&cache=shared&_kine_disable_startup_vacuum=true&_pragma=journal_size_limit(16777216)"
	// sqlitePageSize is the page size of a new SQLite datastore.
	sqlitePageSize = 1024
	// sqlitePollInterval is how often kine reads a SQLite database for
	// changes it did not make itself. There are none: kelp's lock on the
	// directory gives the file one kine, and its own writes wake its
	// poller at once (sqllog's notify), so the poll is a safety net, and
	// kine's default of 1 s is an idle node's query a second for each of
	// its two SQLite stores. What it costs: the one wake-up the poller
	// spends preparing its query (the first write after it starts, or
	// after a failed query) reaches watchers at the next poll.
	sqlitePollInterval = 5 * time.Second
	// progressNotifyInterval is how often kine tells each watch that asked
	// for progress notifications (the apiserver's watch cache, one per
	// resource, each on a gRPC connection of its own) the current
	// revision when nothing it watches changed. kine's default of 5 s,
	// across the ~80 watches of an idle server, woke the apiserver's
	// watch path (kine's sender, gRPC on both ends, the etcd client, the
	// storage watcher, the cacher) about 16 times a second for nothing:
	// the apiserver asks for progress itself when a read must wait for
	// the cache (RequestWatchProgress, which kine answers at once,
	// whatever this interval), and etcd's own default is 10 minutes.
	// A minute keeps the revision a quiet resource's watch cache hands
	// out in bookmarks about as fresh as the bookmarks are frequent.
	progressNotifyInterval = time.Minute
)

// kineEngine is kine serving etcd's API on a unix socket, backed by SQLite,
// PostgreSQL or MySQL.
type kineEngine struct {
	cancel context.CancelFunc
	wg     *sync.WaitGroup
	lock   *dirLock
}

func startKine(ctx context.Context, cfg Config, kind string, log *logrus.Entry) (engine, string, Backend, error) {
	dbDir, err := cfg.dbDir()
	if err != nil {
		return nil, "", Backend{}, err
	}
	spec := kineSpec{
		dbDir:  dbDir,
		runDir: orDefault(cfg.runDir, layout.RunDir),
		tls:    kinetls.Config{CAFile: cfg.CAFile, CertFile: cfg.CertFile, KeyFile: cfg.KeyFile},
		secret: cfg.Endpoint,
	}
	connectTimeout := orDefault(cfg.connectTimeout, remoteConnectTimeout)
	switch kind {
	case KindSQLite:
		spec = sqliteSpec(dbDir, spec.runDir, 0)
	case KindPostgres:
		spec.desc = "PostgreSQL datastore " + Redact(cfg.Endpoint)
		spec.dsn = cfg.Endpoint
		spec.check = func(ctx context.Context) error {
			return checkPostgres(ctx, spec.desc, cfg.Endpoint, spec.tls, connectTimeout)
		}
	case KindMySQL:
		spec.desc = "MySQL datastore " + Redact(cfg.Endpoint)
		spec.dsn = cfg.Endpoint
		spec.check = func(ctx context.Context) error {
			return checkMySQL(ctx, spec.desc, cfg.Endpoint, spec.tls, connectTimeout)
		}
	}
	eng, be, err := listenKine(ctx, spec, log)
	return eng, spec.desc, be, err
}

// sqliteSpec is kine on the SQLite datastore in dbDir. A new database's
// revisions start after firstRevision.
func sqliteSpec(dbDir, runDir string, firstRevision int64) kineSpec {
	dbPath := filepath.Join(dbDir, stateDBName)
	desc := "SQLite datastore " + dbPath
	return kineSpec{
		desc:         desc,
		dbDir:        dbDir,
		runDir:       runDir,
		pollInterval: sqlitePollInterval,
		// kine's DSN for SQLite is a path followed by mattn/go-sqlite3 style
		// parameters, which it translates for modernc.org/sqlite.
		dsn: "sqlite://" + dbPath + "?" + sqliteParams,
		check: func(ctx context.Context) error {
			if wal.Exist(filepath.Join(dbDir, etcdDirName, "member", "wal")) {
				return fmt.Errorf("%s: an embedded etcd datastore exists at %s: start with --cluster-init to use it, or move it away to start an empty SQLite datastore", desc, filepath.Join(dbDir, etcdDirName))
			}
			fresh, err := checkSQLite(ctx, dbPath)
			if err != nil || !fresh {
				return err
			}
			// kine would make it with SQLite's 4 KiB pages; with 1 KiB
			// ones each commit writes half the bytes (a Lease-sized update
			// costs 24 instead of 46 KB of WAL and checkpoint) for LISTs
			// that read the datastore a third slower where objects are
			// 4 KiB (BenchmarkSQLiteWrites, BenchmarkSQLiteReads). An
			// existing database keeps the pages it was made with.
			if err := createKineDB(dbPath, sqlitePageSize, firstRevision); err != nil {
				return fmt.Errorf("%s: %w", desc, err)
			}
			return atomicfile.SyncDir(dbDir)
		},
	}
}

// kineSpec is one kine: the database it serves and where it listens.
type kineSpec struct {
	desc   string // names the database in messages, without secrets
	dbDir  string // holds the lock and, when the path fits, the socket
	runDir string // holds the socket when it does not
	dsn    string
	tls    kinetls.Config // to a remote database
	// secret is an endpoint whose passwords are scrubbed from errors.
	secret string
	// check refuses a database kine must not open; it runs under the lock.
	check func(context.Context) error
	// pollInterval replaces kine's 1 s poll for changes made by others.
	pollInterval time.Duration
}

// listenKine starts kine as spec says, holding the lock on its directory
// until it stops; ctx bounds the check, not kine.
func listenKine(ctx context.Context, spec kineSpec, log *logrus.Entry) (_ engine, _ Backend, rerr error) {
	if err := makePrivateDir(spec.dbDir); err != nil {
		return nil, Backend{}, fmt.Errorf("%s: %w", spec.desc, err)
	}
	lock, err := lockDir(spec.dbDir)
	if err != nil {
		return nil, Backend{}, err
	}
	defer func() {
		if rerr != nil {
			lock.release()
		}
	}()

	sock, err := kineSocket(spec.dbDir, spec.runDir, log)
	if err != nil {
		return nil, Backend{}, fmt.Errorf("%s: %w", spec.desc, err)
	}
	if err := spec.check(ctx); err != nil {
		return nil, Backend{}, scrubError(err, spec.secret)
	}

	// kine ties its lifetime to this context, not to Start's.
	kctx, cancel := context.WithCancel(context.Background())
	wg := &sync.WaitGroup{}
	// scripts/bench-baseline.sh starts a kine of its own with this endpoint.
	log.WithFields(logrus.Fields{"listen": "unix://" + sock, "endpoint": Redact(spec.dsn)}).Debug("starting kine")
	kcfg := kineConfig("unix://"+sock, spec.dsn, wg, spec.tls)
	if spec.pollInterval != 0 {
		kcfg.PollInterval = spec.pollInterval
	}
	etcdCfg, err := endpoint.Listen(kctx, kcfg)
	if err != nil {
		cancel()
		waitGroupTimeout(wg, kineStopTimeout)
		return nil, Backend{}, scrubError(fmt.Errorf("%s: %w", spec.desc, err), spec.secret)
	}
	return &kineEngine{cancel: cancel, wg: wg, lock: lock}, Backend{Endpoints: etcdCfg.Endpoints}, nil
}

func (k *kineEngine) failed() <-chan error { return nil }

// stop ends kine's context, which drains its gRPC server (2 s at most) and
// then closes its database handle; waiting for its WaitGroup waits for both.
// Closing the last SQLite connection checkpoints the WAL into state.db.
// The lock is kept if kine does not stop: it may still write.
func (k *kineEngine) stop() error {
	k.cancel()
	if !waitGroupTimeout(k.wg, kineStopTimeout) {
		return fmt.Errorf("kine did not stop within %s", kineStopTimeout)
	}
	k.lock.release()
	return nil
}

// kineConfig is how kelp runs kine: listening on listener, storing in
// dsn, with the values of kine's own command-line defaults (zero poll and
// batch settings make kine fail or spin) but for progressNotifyInterval.
func kineConfig(listener, dsn string, wg *sync.WaitGroup, backendTLS kinetls.Config) endpoint.Config {
	return endpoint.Config{
		Listener:             listener,
		Endpoint:             dsn,
		WaitGroup:            wg,
		BackendTLSConfig:     backendTLS,
		ConnectionPoolConfig: generic.ConnectionPoolConfig{MaxIdleTime: 2 * time.Minute},
		NotifyInterval:       progressNotifyInterval,
		EmulatedETCDVersion:  "3.6.11",
		CompactTimeout:       5 * time.Second,
		CompactMinRetain:     1000,
		CompactBatchSize:     1000,
		PollBatchSize:        500,
		PollInterval:         time.Second,
	}
}

// kineSocket returns the unix socket kine listens on: kine.sock beside the
// database, or a name derived from it under runDir when that path does not
// fit in a socket address. A socket left by a crashed kelp is removed; one
// that something still listens on is an error.
func kineSocket(dbDir, runDir string, log *logrus.Entry) (string, error) {
	path, fallback := kineSocketPath(dbDir, runDir)
	if fallback {
		log.Infof("Kine socket path %s is longer than %d bytes; using %s instead", filepath.Join(dbDir, kineSocketName), maxSocketPath, path)
		if err := os.MkdirAll(runDir, 0o700); err != nil {
			return "", fmt.Errorf("create %s for the kine socket: %w", runDir, err)
		}
	}
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return path, nil
	}
	if err != nil {
		return "", fmt.Errorf("check kine socket %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return "", fmt.Errorf("kine socket path %s exists and is not a socket: move it away", path)
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		conn.Close()
		return "", fmt.Errorf("another process is listening on kine socket %s: stop the other kelp server using it", path)
	}
	if err := os.Remove(path); err != nil {
		return "", fmt.Errorf("remove stale kine socket %s: %w", path, err)
	}
	log.Infof("Removed stale kine socket %s left by an earlier run", path)
	return path, nil
}

func kineSocketPath(dbDir, runDir string) (path string, fallback bool) {
	path = filepath.Join(dbDir, kineSocketName)
	if len(path) <= maxSocketPath {
		return path, false
	}
	sum := sha256.Sum256([]byte(dbDir))
	return filepath.Join(runDir, "kine-"+hex.EncodeToString(sum[:8])+".sock"), true
}

// waitGroupTimeout waits for wg and reports whether it finished in time.
func waitGroupTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
