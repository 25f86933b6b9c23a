package datastore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/k3s-io/kine/pkg/drivers/sqlite"
	logrustest "github.com/sirupsen/logrus/hooks/test"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestSQLiteRestartKeepsData(t *testing.T) {
	dataDir := t.TempDir()
	cfg := Config{DataDir: dataDir}

	d := startReady(t, cfg)
	be := d.Backend()
	if be.Kind != KindSQLite {
		t.Errorf("Kind = %q, want %q", be.Kind, KindSQLite)
	}
	wantSock := "unix://" + filepath.Join(dataDir, "server", "db", "kine.sock")
	if len(be.Endpoints) != 1 || be.Endpoints[0] != wantSock {
		t.Errorf("Endpoints = %v, want [%s]", be.Endpoints, wantSock)
	}
	if be.CAFile != "" || be.CertFile != "" || be.KeyFile != "" {
		t.Errorf("TLS files for a unix socket: %+v", be)
	}
	put(t, be, "/registry/test/a", "one")
	stopWithin(t, d, 30*time.Second)

	dbDir := filepath.Join(dataDir, "server", "db")
	fi, err := os.Stat(dbDir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("%s has mode %o, want 700", dbDir, perm)
	}
	// A clean close leaves everything in state.db: the WAL is checkpointed
	// and removed when the last connection closes.
	if fi, err := os.Stat(filepath.Join(dbDir, "state.db-wal")); err == nil && fi.Size() > 0 {
		t.Errorf("state.db-wal holds %d bytes after Close; want it checkpointed", fi.Size())
	}
	if _, err := os.Stat(filepath.Join(dbDir, "kine.sock")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("kine.sock left after Close: %v", err)
	}

	d = startReady(t, cfg)
	if got := get(t, d.Backend(), "/registry/test/a"); got != "one" {
		t.Errorf("after restart got %q, want %q", got, "one")
	}
}

func TestSQLiteCorruptDatabaseIsLeftAlone(t *testing.T) {
	garbage := make([]byte, 64<<10)
	if _, err := rand.Read(garbage); err != nil {
		t.Fatal(err)
	}

	// A real database with a damaged b-tree page: the header is fine, so
	// only a check that reads the pages finds the damage.
	damaged := func(t *testing.T) []byte {
		dataDir := t.TempDir()
		d := startReady(t, Config{DataDir: dataDir})
		for i := range 200 {
			put(t, d.Backend(), "/registry/test/"+strings.Repeat("k", 50)+string(rune('a'+i%26))+string(rune('a'+i/26)), strings.Repeat("v", 500))
		}
		stopWithin(t, d, 30*time.Second)
		b, err := os.ReadFile(filepath.Join(dataDir, "server", "db", "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 8*4096 {
			t.Fatalf("state.db is only %d bytes", len(b))
		}
		copy(b[3*4096:5*4096], garbage)
		return b
	}

	for _, tc := range []struct {
		name    string
		content func(t *testing.T) []byte
		wal     bool // a -wal file lies beside it, as after a crash
	}{
		{"garbage", func(*testing.T) []byte { return garbage }, false},
		{"garbage with WAL", func(*testing.T) []byte { return garbage }, true},
		{"text", func(*testing.T) []byte { return []byte("this is not a database\n") }, false},
		{"damaged page", damaged, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			content := tc.content(t)
			dataDir := t.TempDir()
			dbDir := filepath.Join(dataDir, "server", "db")
			if err := os.MkdirAll(dbDir, 0o700); err != nil {
				t.Fatal(err)
			}
			dbPath := filepath.Join(dbDir, "state.db")
			if err := os.WriteFile(dbPath, content, 0o600); err != nil {
				t.Fatal(err)
			}
			var wal []byte
			if tc.wal {
				wal = garbage[:4096]
				if err := os.WriteFile(dbPath+"-wal", wal, 0o600); err != nil {
					t.Fatal(err)
				}
			}

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d, err := Start(ctx, Config{DataDir: dataDir})
			if err == nil {
				stopWithin(t, d, 30*time.Second)
				t.Fatal("Start succeeded on a corrupt state.db")
			}
			t.Logf("error: %v", err)
			for _, want := range []string{dbPath, "corrupt", "restore it from a backup", "move it away"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			after, rerr := os.ReadFile(dbPath)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if !bytes.Equal(after, content) {
				t.Error("state.db was modified")
			}
			if tc.wal {
				if after, err := os.ReadFile(dbPath + "-wal"); err != nil || !bytes.Equal(after, wal) {
					t.Errorf("state.db-wal was modified (%v)", err)
				}
			} else {
				for _, suffix := range []string{"-wal", "-shm", "-journal"} {
					if _, err := os.Stat(dbPath + suffix); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("state.db%s exists after a failed start: %v", suffix, err)
					}
				}
			}
			// The failed Start released its lock.
			d = startReadyAfterMove(t, dataDir, dbPath)
			stopWithin(t, d, 30*time.Second)
		})
	}
}

func TestSQLiteStartsFromCrashedWAL(t *testing.T) {
	src := t.TempDir()
	d := startReady(t, Config{DataDir: src})
	put(t, d.Backend(), "/registry/test/crash", "survives")

	// Copy the files of the running datastore, which is what a power cut
	// leaves: committed data partly in state.db-wal.
	dataDir := copyRunningSQLite(t, src)
	d2 := startReady(t, Config{DataDir: dataDir})
	if got := get(t, d2.Backend(), "/registry/test/crash"); got != "survives" {
		t.Errorf("got %q after a crash, want %q", got, "survives")
	}
}

// startReadyAfterMove does what the error tells the operator to do.
func startReadyAfterMove(t *testing.T, dataDir, dbPath string) *Datastore {
	t.Helper()
	if err := os.Rename(dbPath, dbPath+".corrupt"); err != nil {
		t.Fatal(err)
	}
	return startReady(t, Config{DataDir: dataDir})
}

func TestSecondServerOnSameDataDirFails(t *testing.T) {
	dataDir := t.TempDir()
	first := startReady(t, Config{DataDir: dataDir})

	_, err := Start(context.Background(), Config{DataDir: dataDir})
	if err == nil {
		t.Fatal("second Start on the same data dir succeeded")
	}
	if !strings.Contains(err.Error(), "in use by another kelp server") {
		t.Errorf("error %q does not say the datastore is in use", err)
	}
	put(t, first.Backend(), "/still", "works")
}

func TestStaleSocketDoesNotBlockStart(t *testing.T) {
	dataDir := t.TempDir()
	dbDir := filepath.Join(dataDir, "server", "db")
	if err := os.MkdirAll(dbDir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dbDir, "kine.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	// What a crash leaves behind: the file, with nobody listening.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Stat(sock); err != nil {
		t.Fatal(err)
	}
	startReady(t, Config{DataDir: dataDir})
}

func TestLiveSocketIsRefused(t *testing.T) {
	dataDir := t.TempDir()
	dbDir := filepath.Join(dataDir, "server", "db")
	if err := os.MkdirAll(dbDir, 0o700); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dbDir, "kine.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	_, err = Start(context.Background(), Config{DataDir: dataDir})
	if err == nil || !strings.Contains(err.Error(), "another process is listening") {
		t.Fatalf("Start with a live socket: %v, want an error saying another process listens", err)
	}
	if _, serr := os.Stat(sock); serr != nil {
		t.Errorf("the other process's socket was removed: %v", serr)
	}
}

func TestSocketPathTooLongFallsBack(t *testing.T) {
	short := "/var/lib/kelp/server/db"
	if p, fallback := kineSocketPath(short, "/run/kelp"); fallback || p != short+"/kine.sock" {
		t.Errorf("kineSocketPath(%s) = %s, %v", short, p, fallback)
	}
	long := "/" + strings.Repeat("d", 100) + "/server/db"
	p, fallback := kineSocketPath(long, "/run/kelp")
	if !fallback || !strings.HasPrefix(p, "/run/kelp/kine-") || len(p) > maxSocketPath {
		t.Errorf("kineSocketPath(long) = %s, %v", p, fallback)
	}
	if p2, _ := kineSocketPath(long+"2", "/run/kelp"); p2 == p {
		t.Errorf("two data dirs share the fallback socket %s", p)
	}
	// 107 bytes fit, 108 do not.
	edge := "/" + strings.Repeat("e", maxSocketPath-len("/kine.sock")-1)
	if p, fallback := kineSocketPath(edge, "/run/kelp"); fallback || len(p) != maxSocketPath {
		t.Errorf("kineSocketPath(%d-byte path) fell back to %s", len(p), p)
	}
	if _, fallback := kineSocketPath(edge+"e", "/run/kelp"); !fallback {
		t.Error("a 108-byte socket path did not fall back")
	}

	dataDir := filepath.Join(t.TempDir(), strings.Repeat("x", 60), strings.Repeat("y", 60))
	runDir := t.TempDir()
	d := startReady(t, Config{DataDir: dataDir, runDir: runDir})
	ep := d.Backend().Endpoints[0]
	if !strings.HasPrefix(ep, "unix://"+runDir+"/kine-") {
		t.Errorf("endpoint %s is not under %s", ep, runDir)
	}
	put(t, d.Backend(), "/k", "v")
}

func TestUnwritableDataDir(t *testing.T) {
	// A path below a regular file cannot be created, even by root.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), Config{DataDir: filepath.Join(file, "data")})
	if err == nil || !strings.Contains(err.Error(), "create datastore directory") || !strings.Contains(err.Error(), "--data-dir") {
		t.Fatalf("Start in an unwritable data dir: %v", err)
	}
}

func TestStopIsIdempotentAndBounded(t *testing.T) {
	d := startReady(t, Config{DataDir: t.TempDir()})

	// Keep a watch open, as the apiserver does, so that kine has to drain it.
	cli, err := newClient(d.Backend())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	wch := cli.Watch(wctx, "/", clientv3.WithPrefix())
	put(t, d.Backend(), "/w", "1")
	select {
	case <-wch:
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not fire")
	}

	const deadline = 10 * time.Second
	errs := make(chan error, 3)
	start := time.Now()
	for range 3 {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			errs <- d.Stop(ctx)
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if took := time.Since(start); took > deadline {
		t.Errorf("Close took %s, more than its %s deadline", took, deadline)
	}
	if err := d.Stop(context.Background()); err != nil {
		t.Errorf("Close after Close: %v", err)
	}
	if err := d.WaitReady(context.Background()); err != nil {
		t.Errorf("WaitReady after a successful WaitReady and Close: %v", err)
	}

	// A deadline that has already passed returns at once with an error,
	// even before the first shutdown finished.
	d2 := startReady(t, Config{DataDir: t.TempDir()})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	if err := d2.Stop(ctx); err == nil {
		t.Log("Close with a cancelled context finished the shutdown first")
	} else if !errors.Is(err, context.Canceled) {
		t.Errorf("Close with a cancelled context: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Close with a cancelled context took %s", took)
	}
	if err := d2.Stop(context.Background()); err != nil {
		t.Errorf("second Close after an abandoned one: %v", err)
	}
}

func TestWaitReadyAfterStopBeforeReady(t *testing.T) {
	d, err := Start(context.Background(), Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	stopWithin(t, d, 30*time.Second)
	if err := d.WaitReady(context.Background()); err == nil {
		// Only right if the probe got its answer before Close.
		select {
		case <-d.Ready():
		default:
			t.Error("WaitReady after Close returned nil without Ready")
		}
	} else if !strings.Contains(err.Error(), "stopped before it became ready") {
		t.Errorf("WaitReady after Close: %v", err)
	}
	select {
	case err := <-d.Err():
		t.Errorf("Err after Close: %v", err)
	default:
	}
}

// TestSQLiteStartDoesNotRewriteDatabase checks that kine's start-up VACUUM,
// which rewrites the whole file at every start, stays off.
func TestSQLiteStartDoesNotRewriteDatabase(t *testing.T) {
	hook := logrustest.NewGlobal()
	defer hook.Reset()
	d := startReady(t, Config{DataDir: t.TempDir()})
	stopWithin(t, d, 30*time.Second)
	var disabled bool
	for _, e := range hook.AllEntries() {
		if strings.Contains(e.Message, "Running startup VACUUM") {
			t.Errorf("kine ran a start-up VACUUM")
		}
		disabled = disabled || strings.Contains(e.Message, "Startup VACUUM is disabled")
	}
	if !disabled {
		t.Error(`kine did not log "Startup VACUUM is disabled"`)
	}
}

// kelp's SQLite parameters are kine's with two decisions of its own; a
// kine upgrade that changes its defaults must be looked at.
func TestSQLiteParamsFollowKine(t *testing.T) {
	want := strings.Replace(sqlite.DefaultParams, "_synchronous=NORMAL", "_synchronous=FULL", 1) + "&_kine_disable_startup_vacuum=true&_pragma=journal_size_limit(16777216)"
	if sqliteParams != want {
		t.Errorf("sqliteParams = %q\nwant kine's defaults with synchronous=FULL, no startup VACUUM and a WAL limit: %q", sqliteParams, want)
	}
}

// A new SQLite datastore is made with pages of sqlitePageSize, which halve
// the bytes of a commit; one made with SQLite's 4 KiB pages (by kine, by an
// older kelp) keeps them, and its data.
func TestSQLitePageSize(t *testing.T) {
	pageSize := func(path string) int {
		t.Helper()
		var n int
		queryRow(t, path, "PRAGMA page_size", &n)
		return n
	}

	fresh := t.TempDir()
	d := startReady(t, Config{DataDir: fresh})
	put(t, d.Backend(), "/registry/test/a", "one")
	stopWithin(t, d, 30*time.Second)
	if got := pageSize(filepath.Join(fresh, "server", "db", stateDBName)); got != sqlitePageSize {
		t.Errorf("a new datastore has pages of %d bytes, want %d", got, sqlitePageSize)
	}

	old := t.TempDir()
	dbDir := filepath.Join(old, "server", "db")
	if err := os.MkdirAll(dbDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := createKineDB(filepath.Join(dbDir, stateDBName), 4096, 0); err != nil {
		t.Fatal(err)
	}
	d = startReady(t, Config{DataDir: old})
	put(t, d.Backend(), "/registry/test/a", "one")
	stopWithin(t, d, 30*time.Second)
	d = startReady(t, Config{DataDir: old})
	if got := get(t, d.Backend(), "/registry/test/a"); got != "one" {
		t.Errorf("after a restart got %q, want %q", got, "one")
	}
	stopWithin(t, d, 30*time.Second)
	if got := pageSize(filepath.Join(dbDir, stateDBName)); got != 4096 {
		t.Errorf("an existing datastore of 4096-byte pages has pages of %d bytes now", got)
	}
}

// TestSQLiteWatchNeedsNoPoll checks that a write reaches a watcher of
// either SQLite store at once, not at kine's next poll for changes made
// by others (sqlitePollInterval), which kelp makes rare. The first write
// after kine starts its poller may wait for the poll: the poller spends
// that wake-up preparing its query.
func TestSQLiteWatchNeedsNoPoll(t *testing.T) {
	for name, d := range map[string]*Datastore{
		"disk": startReady(t, Config{DataDir: t.TempDir()}),
		"ram":  startRAMReady(t, RAMConfig{dir: t.TempDir()}),
	} {
		t.Run(name, func(t *testing.T) {
			cli, err := newClient(d.Backend())
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			const key = "/registry/leases/kube-node-lease/n"
			got, err := cli.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			watch := cli.Watch(ctx, key, clientv3.WithRev(got.Header.Revision+1))
			for i, within := range []time.Duration{2 * sqlitePollInterval, sqlitePollInterval / 2} {
				if _, err := cli.Put(ctx, key, strconv.Itoa(i)); err != nil {
					t.Fatal(err)
				}
				select {
				case resp := <-watch:
					if err := resp.Err(); err != nil || len(resp.Events) != 1 {
						t.Fatalf("watch: %v, %d events", err, len(resp.Events))
					}
				case <-time.After(within):
					t.Fatalf("put %d reached no watcher within %s", i+1, within)
				}
			}
		})
	}
}

// TestWatchProgressOnRequest: a watch that asked for progress
// notifications, as the apiserver's watch cache does, hears nothing while
// what it watches is quiet, not every 5 s (kine's default, which woke the
// apiserver's watch path ~16 times a second on an idle server:
// progressNotifyInterval), yet the apiserver's own request for progress,
// which a read that must wait for its cache makes, is answered at once.
func TestWatchProgressOnRequest(t *testing.T) {
	d := startReady(t, Config{DataDir: t.TempDir()})
	cli, err := newClient(d.Backend())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	defer cancel()
	watch := cli.Watch(ctx, "/registry/pods/", clientv3.WithPrefix(), clientv3.WithProgressNotify(), clientv3.WithCreatedNotify())
	if resp := <-watch; !resp.Created {
		t.Fatalf("first watch response is not the created one: %+v", resp)
	}
	rev := putRevision(t, d.Backend(), "/registry/leases/kube-node-lease/n", "1")
	const quiet = 7 * time.Second
	select {
	case resp := <-watch:
		t.Fatalf("watch of a quiet prefix got a response within %s: progress notify %v, revision %d, %d events",
			quiet, resp.IsProgressNotify(), resp.Header.Revision, len(resp.Events))
	case <-time.After(quiet):
	}
	if err := cli.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case resp := <-watch:
		if !resp.IsProgressNotify() || resp.Header.Revision < rev {
			t.Fatalf("asked for progress, got: progress notify %v, revision %d (want >= %d), %d events",
				resp.IsProgressNotify(), resp.Header.Revision, rev, len(resp.Events))
		}
	case <-time.After(2 * time.Second):
		t.Fatal("asked for progress, got no answer within 2 s")
	}
}

// TestCheckpointLeavesTheDataInTheFile: a migration to SQLite moves only
// state.db; after checkpoint the file alone holds what the WAL held.
func TestCheckpointLeavesTheDataInTheFile(t *testing.T) {
	src := t.TempDir()
	d := startReady(t, Config{DataDir: src})
	put(t, d.Backend(), "/registry/test/moved", "whole")

	// The files of a datastore whose WAL was not checkpointed at close.
	dataDir := copyRunningSQLite(t, src)
	path := filepath.Join(dataDir, "server", "db", "state.db")
	if err := checkpoint(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		if err := os.Remove(path + suffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}
	d2 := startReady(t, Config{DataDir: dataDir})
	if got := get(t, d2.Backend(), "/registry/test/moved"); got != "whole" {
		t.Errorf("got %q from the database file alone, want %q", got, "whole")
	}
}

// copyRunningSQLite copies state.db and state.db-wal of the running SQLite
// datastore of data dir src into a new data dir, which it returns: the
// committed data partly in the WAL, as a power cut leaves it.
func copyRunningSQLite(t *testing.T, src string) string {
	t.Helper()
	dataDir := t.TempDir()
	dbDir := filepath.Join(dataDir, "server", "db")
	if err := os.MkdirAll(dbDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"state.db", "state.db-wal"} {
		b, err := os.ReadFile(filepath.Join(src, "server", "db", name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "state.db-wal" && len(b) == 0 {
			t.Fatal("no WAL content while running; the test does not test anything")
		}
		if err := os.WriteFile(filepath.Join(dbDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dataDir
}
