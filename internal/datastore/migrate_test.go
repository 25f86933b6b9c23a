package datastore

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// fill writes n keys under /registry/test/, with values of every byte,
// from a few writers at once.
func fill(t *testing.T, be Backend, n int) {
	t.Helper()
	withClient(t, be, func(ctx context.Context, cli *clientv3.Client) {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 8 {
					value := fmt.Sprintf("value %d \x00\xff", i)
					if _, err := cli.Put(context.Background(), fmt.Sprintf("/registry/test/%05d", i), value); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("fill: %v", err)
		}
	})
}

// contents returns every key and value of be but kine's own, and its
// revision.
func contents(t *testing.T, be Backend) (map[string]string, int64) {
	t.Helper()
	got := map[string]string{}
	var rev int64
	withClient(t, be, func(ctx context.Context, cli *clientv3.Client) {
		resp, err := cli.Get(ctx, "/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if string(kv.Key) != kineHealthKey {
				got[string(kv.Key)] = string(kv.Value)
			}
		}
		rev = resp.Header.Revision
	})
	return got, rev
}

func sameContents(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d keys, want %d", what, len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %q, want %q", what, k, got[k], v)
			return
		}
	}
}

func migrate(t *testing.T, from, to Config) Migrated {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, err := Migrate(ctx, from, to)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return m
}

// A cluster goes from SQLite to embedded etcd and back with every key and
// value, the leases that keep Events, and revisions that only go up; each
// source is kept beside the new datastore.
func TestMigrateSQLiteToEtcdAndBack(t *testing.T) {
	tls := etcdTestTLS(t)
	dataDir := t.TempDir()
	sqlite := Config{DataDir: dataDir}

	d := startReady(t, sqlite)
	fill(t, d.Backend(), 1200) // more than two pages
	rev := putRevision(t, d.Backend(), "/registry/test/deleted", "gone")
	withClient(t, d.Backend(), func(ctx context.Context, cli *clientv3.Client) {
		// kine deletes only the way the apiserver does.
		key := "/registry/test/deleted"
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpDelete(key)).Else(clientv3.OpGet(key)).Commit()
		if err != nil || !resp.Succeeded {
			t.Fatalf("delete: %v", err)
		}
		lease, err := cli.Grant(ctx, 3600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, "/registry/events/default/e1", "event", clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	})
	want, sqliteRev := contents(t, d.Backend())
	stopWithin(t, d, 30*time.Second)

	m := migrate(t, sqlite, etcdTestConfig(t, dataDir, tls))
	if m.Keys != len(want) || m.Revision != sqliteRev {
		t.Errorf("migrated %d keys at revision %d, want %d at %d", m.Keys, m.Revision, len(want), sqliteRev)
	}
	if LocalKind(dataDir) != KindEtcd {
		t.Fatalf("after the migration the data dir holds %q, want etcd", LocalKind(dataDir))
	}
	if !strings.Contains(m.Kept, "state.db.before-migrate-") || !nonEmpty(m.Kept) {
		t.Errorf("the SQLite source was not kept: %q", m.Kept)
	}

	d = startReady(t, etcdTestConfig(t, dataDir, tls))
	got, etcdRev := contents(t, d.Backend())
	sameContents(t, "etcd", got, want)
	if etcdRev <= sqliteRev {
		t.Errorf("etcd revision %d is not above SQLite's %d", etcdRev, sqliteRev)
	}
	withClient(t, d.Backend(), func(ctx context.Context, cli *clientv3.Client) {
		resp, err := cli.Get(ctx, "/registry/events/default/e1")
		if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
			t.Fatalf("the event lost its lease: %v %v", resp, err)
		}
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
		if err != nil || ttl.TTL < 3000 || ttl.TTL > 3600 {
			t.Errorf("the event's lease has %v s left (%v), want about an hour", ttl.TTL, err)
		}
	})
	put(t, d.Backend(), "/registry/test/on-etcd", "new")
	want, etcdRev = contents(t, d.Backend())
	stopWithin(t, d, 30*time.Second)

	m = migrate(t, etcdTestConfig(t, dataDir, tls), sqlite)
	if LocalKind(dataDir) != KindSQLite {
		t.Fatalf("after the migration back the data dir holds %q, want SQLite", LocalKind(dataDir))
	}
	if !strings.Contains(m.Kept, "etcd.before-migrate-") || !exists(filepath.Join(m.Kept, "member", "wal")) {
		t.Errorf("the etcd source was not kept: %q", m.Kept)
	}
	d = startReady(t, sqlite)
	got, backRev := contents(t, d.Backend())
	sameContents(t, "SQLite", got, want)
	if backRev <= etcdRev {
		t.Errorf("SQLite revision %d is not above etcd's %d", backRev, etcdRev)
	}
}

func TestMigrateRefuses(t *testing.T) {
	tls := etcdTestTLS(t)
	dataDir := t.TempDir()
	sqlite := Config{DataDir: dataDir}
	d := startReady(t, sqlite)
	put(t, d.Backend(), "/registry/test/a", "one")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := Migrate(ctx, sqlite, etcdTestConfig(t, dataDir, tls)); err == nil || !strings.Contains(err.Error(), "in use by another kelp server (pid") {
		t.Errorf("migrating a running server: %v", err)
	}
	stopWithin(t, d, 30*time.Second)
	if _, err := Migrate(ctx, sqlite, sqlite); err == nil || !strings.Contains(err.Error(), "nothing to migrate") {
		t.Errorf("migrating to the same datastore: %v", err)
	}
	etcdDir := filepath.Join(dataDir, "server", "db", "etcd")
	if err := os.MkdirAll(etcdDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Migrate(ctx, sqlite, etcdTestConfig(t, dataDir, tls)); err == nil || !strings.Contains(err.Error(), "move it away") {
		t.Errorf("migrating onto an existing etcd directory: %v", err)
	}
	if err := os.Remove(etcdDir); err != nil {
		t.Fatal(err)
	}
	if LocalKind(dataDir) != KindSQLite {
		t.Fatal("a refused migration changed the data dir")
	}
	d = startReady(t, sqlite)
	if got := get(t, d.Backend(), "/registry/test/a"); got != "one" {
		t.Errorf("after refused migrations got %q", got)
	}
}

// A migration killed with SIGKILL while it copies leaves the server's
// SQLite datastore as it was, and the next migration completes.
func TestMigrateKilledMidway(t *testing.T) {
	if os.Getenv("KELP_MIGRATE_CHILD") != "" {
		t.Skip("run by TestMigrateKilledMidway in a child process")
	}
	dataDir := t.TempDir()
	sqlite := Config{DataDir: dataDir}
	d := startReady(t, sqlite)
	fill(t, d.Backend(), 3000)
	want, _ := contents(t, d.Backend())
	stopWithin(t, d, 30*time.Second)

	tls := etcdTestTLS(t)
	child := exec.Command(os.Args[0], "-test.run", "^TestMigrateChild$", "-test.v")
	child.Env = append(os.Environ(), "KELP_MIGRATE_CHILD="+dataDir,
		"KELP_MIGRATE_TLS="+strings.Join([]string{tls.ServerCA, tls.Server.Cert, tls.Server.Key, tls.PeerCA, tls.Peer.Cert, tls.Peer.Key, tls.Client.Cert, tls.Client.Key}, ","))
	stderr, err := child.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stdout = child.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	copying := make(chan struct{})
	go func() {
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			if strings.Contains(lines.Text(), "Copying the cluster") {
				close(copying)
				break
			}
		}
		for lines.Scan() {
		}
	}()
	select {
	case <-copying:
	case <-time.After(time.Minute):
		_ = child.Process.Kill()
		t.Fatal("the migration did not start copying within a minute")
	}
	time.Sleep(200 * time.Millisecond)
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := child.Wait(); err == nil {
		t.Fatal("the migration finished before it was killed: give it more to copy")
	}
	db := filepath.Join(dataDir, "server", "db")
	leftovers, _ := filepath.Glob(filepath.Join(db, migratingPrefix+"*"))
	if len(leftovers) != 1 || exists(filepath.Join(db, etcdDirName)) {
		t.Fatalf("the kill did not land while copying: leftovers %v", leftovers)
	}

	d = startReady(t, sqlite)
	got, _ := contents(t, d.Backend())
	sameContents(t, "SQLite after a killed migration", got, want)
	stopWithin(t, d, 30*time.Second)

	migrate(t, sqlite, etcdTestConfig(t, dataDir, tls))
	if leftovers, _ := filepath.Glob(filepath.Join(db, migratingPrefix+"*")); len(leftovers) != 0 {
		t.Errorf("the killed migration's leftovers stayed: %v", leftovers)
	}
	d = startReady(t, etcdTestConfig(t, dataDir, tls))
	got, _ = contents(t, d.Backend())
	sameContents(t, "etcd after the second migration", got, want)
}

// TestMigrateChild is the migration TestMigrateKilledMidway kills.
func TestMigrateChild(t *testing.T) {
	dataDir := os.Getenv("KELP_MIGRATE_CHILD")
	if dataDir == "" {
		t.Skip("run by TestMigrateKilledMidway")
	}
	f := strings.Split(os.Getenv("KELP_MIGRATE_TLS"), ",")
	tls := EtcdTLS{ServerCA: f[0], PeerCA: f[3]}
	tls.Server.Cert, tls.Server.Key = f[1], f[2]
	tls.Peer.Cert, tls.Peer.Key = f[4], f[5]
	tls.Client.Cert, tls.Client.Key = f[6], f[7]
	var out bytes.Buffer
	_, err := Migrate(context.Background(), Config{DataDir: dataDir}, etcdTestConfig(t, dataDir, tls))
	fmt.Fprintln(&out, "migration ended:", err)
	os.Stdout.Write(out.Bytes())
}

// A cluster goes to an external etcd (an embedded one stands in) with its
// client certificates, and back; the external etcd keeps what it holds.
func TestMigrateExternalEtcd(t *testing.T) {
	tls := etcdTestTLS(t)
	embedded := startReady(t, etcdTestConfig(t, t.TempDir(), tls))
	dataDir := t.TempDir()
	sqlite := Config{DataDir: dataDir}
	external := Config{DataDir: dataDir, Endpoint: embedded.Backend().Endpoints[0], CAFile: tls.ServerCA, CertFile: tls.Client.Cert, KeyFile: tls.Client.Key}

	d := startReady(t, sqlite)
	fill(t, d.Backend(), 100)
	want, _ := contents(t, d.Backend())
	stopWithin(t, d, 30*time.Second)

	migrate(t, sqlite, external)
	if LocalKind(dataDir) != "" {
		t.Errorf("the SQLite source was not moved aside: %q", LocalKind(dataDir))
	}
	got, _ := contents(t, embedded.Backend())
	sameContents(t, "external etcd", got, want)

	m := migrate(t, external, sqlite)
	if m.Kept != "" {
		t.Errorf("an external source was kept as %q: it stays where it is", m.Kept)
	}
	d = startReady(t, sqlite)
	got, _ = contents(t, d.Backend())
	sameContents(t, "SQLite from external etcd", got, want)
	got, _ = contents(t, embedded.Backend())
	sameContents(t, "external etcd after the migration back", got, want)
}
