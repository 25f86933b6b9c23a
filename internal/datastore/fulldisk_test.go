package datastore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// onSmallDisk runs the test child in a child process, in a mount namespace
// of its own where smallDisk mounts a tmpfs: the namespace, and with it the
// mount, goes away when the child exits, however it ends.
func onSmallDisk(t *testing.T, child string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: run as root")
	}
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "-test.run", "^"+child+"$", "-test.v")
	cmd.Env = append(os.Environ(), "KELP_SMALL_DISK="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+child) {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// smallDisk mounts a 256 MiB tmpfs for a test onSmallDisk runs and
// returns its path; it skips the test when run otherwise.
func smallDisk(t *testing.T) string {
	t.Helper()
	base := os.Getenv("KELP_SMALL_DISK")
	if base == "" {
		t.Skip("run in a child process by the test without Child in its name")
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", base).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs: %v\n%s", err, out)
	}
	return base
}

func freeSpace(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// fillDisk takes size bytes of dir's file system in one file, returned.
func fillDisk(t *testing.T, dir string, size int64) string {
	t.Helper()
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	return filler
}

// A SQLite datastore on a full disk refuses the creates it cannot keep:
// kine answered them as done (scripts/patches/kine-create-error.patch).
func TestSQLiteFullDiskAcknowledgesOnlyWhatItKeeps(t *testing.T) {
	onSmallDisk(t, "TestSQLiteFullDiskChild")
}

func TestSQLiteFullDiskChild(t *testing.T) {
	base := smallDisk(t)
	dataDir := filepath.Join(base, "data")
	d := startReady(t, Config{DataDir: dataDir})
	filler := fillDisk(t, base, freeSpace(t, base)-3<<20)
	var acked []string
	refused := 0
	withClient(t, d.Backend(), func(ctx context.Context, cli *clientv3.Client) {
		for i := range 1500 {
			key := fmt.Sprintf("/registry/big/%04d", i)
			resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, strings.Repeat("x", 4096))).Commit()
			switch {
			case err != nil && strings.Contains(err.Error(), "disk is full"):
				refused++
			case err != nil || !resp.Succeeded:
				t.Fatalf("create %s: %v, %v", key, err, resp)
			default:
				acked = append(acked, key)
			}
		}
	})
	stopWithin(t, d, 30*time.Second)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	d = startReady(t, Config{DataDir: dataDir})
	got, _ := contents(t, d.Backend())
	t.Logf("%d creates acknowledged, %d refused; %d kept", len(acked), refused, len(got))
	if refused == 0 {
		t.Error("no create was refused: the disk did not fill")
	}
	for _, key := range acked {
		if _, ok := got[key]; !ok {
			t.Fatalf("%s was acknowledged and is not kept", key)
		}
	}
}

// A migration that fills the disk fails, leaves the source as it was and
// nothing of its own, and the next one, with room, completes. The data dir
// is a small tmpfs in a mount namespace of a child process, which takes it
// away when it exits.
func TestMigrateDiskFull(t *testing.T) {
	onSmallDisk(t, "TestMigrateDiskFullChild")
}

// TestMigrateDiskFullChild is the migration TestMigrateDiskFull runs on a
// full disk.
func TestMigrateDiskFullChild(t *testing.T) {
	base := smallDisk(t)
	tls := etcdTestTLS(t)
	dataDir := filepath.Join(base, "data")
	etcd := etcdTestConfig(t, dataDir, tls)
	d := startReady(t, etcd)
	fill(t, d.Backend(), 3000)
	withClient(t, d.Backend(), func(ctx context.Context, cli *clientv3.Client) {
		for i := range 1500 {
			if _, err := cli.Put(ctx, fmt.Sprintf("/registry/big/%04d", i), strings.Repeat("x", 4096)); err != nil {
				t.Fatal(err)
			}
		}
	})
	want, _ := contents(t, d.Backend())
	stopWithin(t, d, 30*time.Second)

	// The disk is filled to leave 3 MiB beyond what the source etcd takes
	// when it starts (the next segment of its WAL): the SQLite copy of 6 MiB
	// of values needs more.
	d = startReady(t, etcdTestConfig(t, dataDir, tls))
	running := freeSpace(t, base)
	stopWithin(t, d, 30*time.Second)
	stopped := freeSpace(t, base)
	filler := fillDisk(t, base, running-3<<20)
	t.Logf("etcd takes %d MiB when it starts; %d MiB left", (stopped-running)>>20, freeSpace(t, base)>>20)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := Migrate(ctx, etcdTestConfig(t, dataDir, tls), Config{DataDir: dataDir})
	if err == nil || !strings.Contains(err.Error(), "disk is full") || !strings.Contains(err.Error(), "write /registry/") {
		t.Fatalf("migration onto a full disk: %v, want it to fail copying, saying the disk is full", err)
	}
	t.Logf("on a full disk: %v", err)
	db := filepath.Join(dataDir, "server", "db")
	if leftovers, _ := filepath.Glob(filepath.Join(db, migratingPrefix+"*")); len(leftovers) != 0 || LocalKind(dataDir) != KindEtcd {
		t.Errorf("a failed migration left %v, and the data dir holds %q", leftovers, LocalKind(dataDir))
	}
	d = startReady(t, etcdTestConfig(t, dataDir, tls))
	got, _ := contents(t, d.Backend())
	sameContents(t, "etcd after a migration that filled the disk", got, want)
	stopWithin(t, d, 30*time.Second)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	migrate(t, etcdTestConfig(t, dataDir, tls), Config{DataDir: dataDir})
	d = startReady(t, Config{DataDir: dataDir})
	got, _ = contents(t, d.Backend())
	sameContents(t, "SQLite once there was room", got, want)
}
