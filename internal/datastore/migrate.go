package datastore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kelp-dev/kelp/internal/layout"
)

const (
	// migratingPrefix names the directory a migration builds its target
	// in, beside the datastore; one left by a killed migration is removed
	// by the next.
	migratingPrefix = "migrating-"
	// migratePageSize is how many keys one read of the source returns.
	migratePageSize = 500
	// migrateStopTimeout bounds the stop of each datastore a migration ran.
	migrateStopTimeout = 30 * time.Second
)

// Migrated is what a migration did.
type Migrated struct {
	// Keys is how many keys were copied, Revision the source's revision
	// they were read at.
	Keys     int
	Revision int64
	// Kept is where the local source now is, renamed; empty when it was
	// an external datastore, which is left as it was.
	Kept string
	// From and To describe the two datastores, for messages.
	From, To string
}

// Migrate moves a stopped server's cluster from the datastore from
// describes to the one to describes, both with the server's data dir:
// every key, with its value as stored (Secrets stay encrypted) and a lease
// of the time it had left. The source is read at one revision and never
// written; the target must be empty, and a local one is built beside the
// datastore and put in place only once its content matches the source's,
// key for key. A SQLite or embedded etcd target starts its revisions above
// the source's, so that the watches and caches of clients start over
// instead of missing changes. A local source is then kept, renamed, beside
// the new datastore (Migrated.Kept) for the user to remove; an external
// one is left as it is. On error nothing is changed but a leftover
// directory, which the next migration removes.
func Migrate(ctx context.Context, from, to Config) (_ Migrated, rerr error) {
	if err := errors.Join(from.Validate(), to.Validate()); err != nil {
		return Migrated{}, err
	}
	fromKind, toKind := from.kind(), to.kind()
	if fromKind == toKind && from.Endpoint == to.Endpoint {
		return Migrated{}, fmt.Errorf("the server already keeps its cluster in %s: nothing to migrate", describeKind(to))
	}
	db, err := from.dbDir()
	if err != nil {
		return Migrated{}, err
	}
	if isLocal(fromKind) && LocalKind(from.DataDir) != fromKind {
		return Migrated{}, fmt.Errorf("no %s datastore in %s to migrate: give the server's --data-dir, and the settings it runs with (--config)", describeKind(from), db)
	}
	if err := targetFree(db, toKind); err != nil {
		return Migrated{}, err
	}
	log := logrus.WithField("component", "datastore migration")

	// Start takes the lock a running server holds, except on an external
	// etcd, where it is taken here; either is released with the source.
	var lock *dirLock
	if fromKind == KindExternalEtcd {
		if err := makePrivateDir(db); err != nil {
			return Migrated{}, err
		}
		if lock, err = lockDir(db); err != nil {
			return Migrated{}, err
		}
	}
	src, err := Start(ctx, from)
	if err != nil {
		if lock != nil {
			lock.release()
		}
		return Migrated{}, fmt.Errorf("open the source: %w", err)
	}
	srcStopped := false
	stopSource := func() error {
		if srcStopped {
			return nil
		}
		srcStopped = true
		if lock != nil {
			defer lock.release()
		}
		return stopStore(src)
	}
	defer func() { rerr = errors.Join(rerr, stopSource()) }()
	if err := src.WaitReady(ctx); err != nil {
		if fromKind == KindEtcd {
			err = fmt.Errorf("%w; an embedded etcd member answers only with a quorum: stop every server, run kelp server --cluster-reset on this one, then migrate", err)
		}
		return Migrated{}, fmt.Errorf("open the source: %w", err)
	}
	if err := removeLeftovers(db, log); err != nil {
		return Migrated{}, err
	}
	stamp := time.Now().UTC().Format("20060102T150405Z")
	staging := filepath.Join(db, migratingPrefix+stamp)
	defer os.RemoveAll(staging)

	srcCli, err := newClient(src.Backend())
	if err != nil {
		return Migrated{}, err
	}
	defer srcCli.Close()
	head, err := srcCli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		return Migrated{}, fmt.Errorf("read %s: %w", src.desc, err)
	}
	m := Migrated{Revision: head.Header.Revision, From: src.desc}

	target, err := startTarget(ctx, to, staging, m.Revision)
	if err != nil {
		return Migrated{}, fmt.Errorf("open the target: %w", err)
	}
	m.To = target.desc
	if toKind == KindEtcd {
		m.To = "embedded etcd " + EtcdDir(from.DataDir)
	} else if toKind == KindSQLite {
		m.To = "SQLite datastore " + filepath.Join(db, stateDBName)
	}
	tgtStopped := false
	stopTarget := func() error {
		if tgtStopped {
			return nil
		}
		tgtStopped = true
		return stopStore(target)
	}
	defer func() { rerr = errors.Join(rerr, stopTarget()) }()
	tgtCli, err := newClient(target.Backend())
	if err != nil {
		return Migrated{}, err
	}
	defer tgtCli.Close()

	log.WithFields(logrus.Fields{"from": m.From, "to": m.To, "revision": m.Revision}).Info("Copying the cluster")
	began := time.Now()
	sum, n, err := copyKeys(ctx, srcCli, tgtCli, m.Revision, isKine(fromKind))
	if err != nil {
		return Migrated{}, err
	}
	m.Keys = n
	got, gotN, err := digestKeys(ctx, tgtCli)
	if err != nil {
		return Migrated{}, fmt.Errorf("read back %s: %w", m.To, err)
	}
	if gotN != n || !bytes.Equal(got, sum) {
		return Migrated{}, fmt.Errorf("the copy in %s does not match the source (%d keys copied, %d read back): nothing was changed", m.To, n, gotN)
	}
	log.WithFields(logrus.Fields{"keys": n, "took": time.Since(began).Round(time.Millisecond)}).Info("Copied the cluster, and read it back equal")

	snap := filepath.Join(staging, "etcd.snapshot")
	if toKind == KindEtcd {
		if err := saveSnapshot(ctx, tgtCli, snap); err != nil {
			return Migrated{}, err
		}
	}
	tgtCli.Close()
	if err := errors.Join(stopTarget(), stopSource()); err != nil {
		return Migrated{}, err
	}
	kept, err := switchOver(from.DataDir, staging, fromKind, toKind, snap, EtcdMember{Name: to.Name, AdvertiseIP: to.AdvertiseIP}, m.Revision)
	m.Kept = kept
	return m, err
}

// targetFree refuses a local target that already holds a datastore: a
// migration never overwrites one.
func targetFree(db, toKind string) error {
	switch toKind {
	case KindSQLite:
		if path := filepath.Join(db, stateDBName); nonEmpty(path) {
			return fmt.Errorf("a SQLite datastore exists at %s: move it away to migrate into a new one", path)
		}
	case KindEtcd:
		if dir := filepath.Join(db, etcdDirName); exists(dir) {
			return fmt.Errorf("an embedded etcd datastore exists at %s: move it away to migrate into a new one", dir)
		}
	}
	return nil
}

// removeLeftovers removes what a killed migration left; the caller holds
// the datastore's lock, so no migration is running.
func removeLeftovers(db string, log *logrus.Entry) error {
	entries, err := os.ReadDir(db)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), migratingPrefix) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(db, e.Name())); err != nil {
			return fmt.Errorf("remove what an interrupted migration left: %w", err)
		}
		log.Infof("Removed %s, left by an interrupted migration", filepath.Join(db, e.Name()))
	}
	return nil
}

// startTarget starts the datastore to, which must be empty: a SQLite
// datastore or a one-member embedded etcd in staging, or an external one.
// A SQLite target's revisions start above fromRevision.
func startTarget(ctx context.Context, to Config, staging string, fromRevision int64) (*Datastore, error) {
	log := logrus.WithField("component", "datastore migration")
	var d *Datastore
	switch to.kind() {
	case KindSQLite:
		if err := makePrivateDir(staging); err != nil {
			return nil, err
		}
		spec := sqliteSpec(staging, orDefault(to.runDir, layout.RunDir), fromRevision)
		eng, be, err := listenKine(ctx, spec, log)
		if err != nil {
			return nil, err
		}
		be.Kind = KindSQLite
		d = newDatastore("migration target", spec.desc, eng, be, readyTimeout, log)
	case KindEtcd:
		// A member of its own on free ports: it becomes the server's
		// member through a snapshot, restored with the server's name and
		// peer address and a revision above the source's.
		ports, err := freeLocalPorts(2)
		if err != nil {
			return nil, err
		}
		cfg := to
		cfg.DataDir, cfg.Name, cfg.AdvertiseIP = staging, "migration", "127.0.0.1"
		cfg.InitialCluster, cfg.ForceNewCluster = "", false
		cfg.clientPort, cfg.peerPort = ports[0], ports[1]
		if d, err = Start(ctx, cfg); err != nil {
			return nil, err
		}
	default:
		cfg := to
		cfg.DataDir = staging
		var err error
		if d, err = Start(ctx, cfg); err != nil {
			return nil, err
		}
	}
	if err := d.WaitReady(ctx); err != nil {
		return nil, errors.Join(err, stopStore(d))
	}
	cli, err := newClient(d.Backend())
	if err != nil {
		return nil, errors.Join(err, stopStore(d))
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithLimit(2))
	if err == nil {
		for _, kv := range resp.Kvs {
			if string(kv.Key) != kineHealthKey {
				err = fmt.Errorf("%s is not empty (it holds %s): migrate into an empty database", d.desc, kv.Key)
				break
			}
		}
	}
	if err != nil {
		return nil, errors.Join(err, stopStore(d))
	}
	return d, nil
}

// copyKeys copies every key of src at revision rev into dst, where none
// exists yet, and returns the digest of what it copied (see digestKeys)
// and how many keys. A lease becomes one of the time it has left: from
// kine, whose lease IDs are their TTLs in seconds, the full TTL. A key
// whose lease ran out is not copied.
func copyKeys(ctx context.Context, src, dst *clientv3.Client, rev int64, kineSource bool) ([]byte, int, error) {
	leases := map[int64]clientv3.LeaseID{} // source lease → target lease; 0: expired
	h := sha256.New()
	n := 0
	err := eachKey(ctx, src, rev, func(kv *mvccpb.KeyValue) error {
		var opts []clientv3.OpOption
		if kv.Lease != 0 {
			lease, ok := leases[kv.Lease]
			if !ok {
				ttl := kv.Lease
				if !kineSource {
					left, err := src.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
					if err != nil {
						return fmt.Errorf("read the lease of %s: %w", kv.Key, err)
					}
					ttl = left.TTL
				}
				if ttl > 0 {
					granted, err := dst.Grant(ctx, ttl)
					if err != nil {
						return fmt.Errorf("grant a lease for %s: %w", kv.Key, err)
					}
					lease = granted.ID
				}
				leases[kv.Lease] = lease
			}
			if lease == 0 {
				return nil
			}
			opts = append(opts, clientv3.WithLease(lease))
		}
		key := string(kv.Key)
		resp, err := dst.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(kv.Value), opts...)).
			Commit()
		if err != nil {
			return fmt.Errorf("write %s: %w", key, err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("write %s: the target already holds it", key)
		}
		addToDigest(h, kv)
		n++
		return nil
	})
	return h.Sum(nil), n, err
}

// digestKeys returns a digest of every key and value of cli, at its
// current revision, in key order, and how many keys there are.
func digestKeys(ctx context.Context, cli *clientv3.Client) ([]byte, int, error) {
	head, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		return nil, 0, err
	}
	h := sha256.New()
	n := 0
	err = eachKey(ctx, cli, head.Header.Revision, func(kv *mvccpb.KeyValue) error {
		addToDigest(h, kv)
		n++
		return nil
	})
	return h.Sum(nil), n, err
}

func addToDigest(h hash.Hash, kv *mvccpb.KeyValue) {
	for _, b := range [][]byte{kv.Key, kv.Value} {
		_ = binary.Write(h, binary.BigEndian, uint64(len(b)))
		h.Write(b)
	}
}

// kineHealthKey is a key kine writes itself when it starts, not the
// cluster's: a migration neither copies nor compares it.
const kineHealthKey = "/registry/health"

// eachKey calls fn with every key under "/" at revision rev but kine's
// own, in order, a page at a time, the way the apiserver pages a list.
func eachKey(ctx context.Context, cli *clientv3.Client, rev int64, fn func(*mvccpb.KeyValue) error) error {
	end := clientv3.GetPrefixRangeEnd("/")
	for key := "/"; ; {
		resp, err := cli.Get(ctx, key, clientv3.WithRange(end), clientv3.WithLimit(migratePageSize), clientv3.WithRev(rev))
		if err != nil {
			return fmt.Errorf("read keys from %q at revision %d: %w", key, rev, err)
		}
		for _, kv := range resp.Kvs {
			if string(kv.Key) == kineHealthKey {
				continue
			}
			if err := fn(kv); err != nil {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// saveSnapshot writes an etcd snapshot of cli's member to path.
func saveSnapshot(ctx context.Context, cli *clientv3.Client, path string) error {
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("snapshot the new etcd: %w", err)
	}
	defer rc.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(f, rc); err != nil {
		return fmt.Errorf("snapshot the new etcd: %w", err)
	}
	return f.Sync()
}

// switchOver puts the target built in staging in place of the source,
// under the datastore's lock: first the new datastore, then the local
// source moved aside (MoveAside), so that at every moment the data dir
// holds the whole cluster. It returns where the source was kept.
func switchOver(dataDir, staging, fromKind, toKind, snap string, member EtcdMember, fromRevision int64) (string, error) {
	db, err := dbDirOf(dataDir)
	if err != nil {
		return "", err
	}
	lock, err := lockDir(db)
	if err != nil {
		return "", fmt.Errorf("%w: the migration is complete but was not put in place; nothing was changed", err)
	}
	defer lock.release()
	now := time.Now()
	staged := filepath.Join(staging, stateDBName)
	switch toKind {
	case KindSQLite:
		// Only the database file moves: its WAL must hold nothing.
		ctx, cancel := context.WithTimeout(context.Background(), migrateStopTimeout)
		err := checkpoint(ctx, staged)
		cancel()
		if err != nil {
			return "", fmt.Errorf("%w: the migration was not put in place; nothing was changed", err)
		}
	case KindEtcd:
		// Above the source's revision and the restore bump of any snapshot
		// restored into the source.
		staged = filepath.Join(staging, "member")
		if err := buildMember(staged, snap, member, uint64(fromRevision)+restoreRevisionBump); err != nil {
			return "", err
		}
	}
	if isLocal(toKind) {
		// The target is free (targetFree): nothing is moved aside.
		if _, err := replace(dataDir, toKind, staged, AsideMigrate, now); err != nil {
			return "", fmt.Errorf("put the new datastore in place: %w", err)
		}
	}
	if !isLocal(fromKind) {
		return "", nil
	}
	kept, err := MoveAside(dataDir, fromKind, AsideMigrate, now)
	if err != nil {
		return "", fmt.Errorf("keep the %s datastore: %w; move it away by hand before starting the server", describeKind(Config{ClusterInit: fromKind == KindEtcd}), err)
	}
	return kept, nil
}

// stopStore stops d within migrateStopTimeout.
func stopStore(d *Datastore) error {
	ctx, cancel := context.WithTimeout(context.Background(), migrateStopTimeout)
	defer cancel()
	return d.Stop(ctx)
}

// freeLocalPorts returns n distinct ports free on 127.0.0.1.
func freeLocalPorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port on 127.0.0.1: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func isLocal(kind string) bool {
	return kind == KindSQLite || kind == KindEtcd
}

func isKine(kind string) bool {
	return kind == KindSQLite || kind == KindPostgres || kind == KindMySQL
}

// describeKind names the datastore cfg describes, without secrets.
func describeKind(cfg Config) string {
	switch cfg.kind() {
	case KindSQLite:
		return "SQLite"
	case KindEtcd:
		return "embedded etcd"
	}
	return Redact(cfg.Endpoint)
}
