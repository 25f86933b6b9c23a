package etcdctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
)

// Upstream etcdctl prints to os.Stdout and exits the process when a command
// fails, so the tests run it in a copy of the test binary: with mainEnv set,
// the binary is etcdctl.
const (
	mainEnv  = "KELP_ETCDCTL_TEST_MAIN"
	netnsEnv = "KELP_ETCDCTL_TEST_NETNS"
)

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) != "" {
		if err := Main(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "etcdctl:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type result struct {
	stdout, stderr string
	err            error
}

// run runs `kelp etcdctl args...` with env added to an environment
// cleared of ETCDCTL_* and KELP_* variables.
func run(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return runContext(ctx, env, "", args...)
}

func runContext(ctx context.Context, env []string, stdin string, args ...string) result {
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"etcdctl"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCDCTL_") && !strings.HasPrefix(kv, "KELP_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, mainEnv+"=1"), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return result{stdout.String(), stderr.String(), err}
}

// ok runs etcdctl and fails the test unless it succeeds.
func ok(t *testing.T, args ...string) string {
	t.Helper()
	r := run(t, nil, args...)
	if r.err != nil {
		t.Fatalf("etcdctl %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.err, r.stdout, r.stderr)
	}
	return r.stdout
}

func startDatastore(t *testing.T, cfg datastore.Config) *datastore.Datastore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := datastore.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start datastore: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			t.Errorf("stop datastore: %v", err)
		}
	})
	if err := d.WaitReady(ctx); err != nil {
		t.Fatalf("datastore not ready: %v", err)
	}
	return d
}

func TestSQLite(t *testing.T) {
	dataDir := t.TempDir()
	startDatastore(t, datastore.Config{DataDir: dataDir})

	ok(t, "--data-dir", dataDir, "put", "/registry/pods/default/my-pod", "pod-1")
	ok(t, "--data-dir", dataDir, "put", "/registry/pods/default/other", "pod-2")
	if got, want := ok(t, "--data-dir", dataDir, "get", "--prefix", "--keys-only", "/registry/pods/"), "/registry/pods/default/my-pod\n\n/registry/pods/default/other\n\n"; got != want {
		t.Errorf("get --prefix --keys-only = %q, want %q", got, want)
	}
	if got, want := ok(t, "--data-dir", dataDir, "get", "--print-value-only", "/registry/pods/default/my-pod"), "pod-1\n"; got != want {
		t.Errorf("get --print-value-only = %q, want %q", got, want)
	}
	// kine refuses etcdctl del; it deletes in the transaction the
	// apiserver uses, at the key's revision.
	r := runContext(context.Background(), nil, deleteTxn("/registry/pods/default/other", modRevision(t, dataDir, "/registry/pods/default/other")), "--data-dir", dataDir, "txn")
	if r.err != nil || !strings.HasPrefix(r.stdout, "SUCCESS\n") {
		t.Errorf("txn delete: %v\n%s%s", r.err, r.stdout, r.stderr)
	}

	// KELP_DATA_DIR finds the data dir as kelp server does.
	r = run(t, []string{"KELP_DATA_DIR=" + dataDir}, "get", "--prefix", "--keys-only", "/registry/")
	if r.err != nil || !strings.Contains(r.stdout, "/registry/pods/default/my-pod") || strings.Contains(r.stdout, "other") {
		t.Errorf("with KELP_DATA_DIR: %v\n%s%s", r.err, r.stdout, r.stderr)
	}
	// The user's endpoint wins over the data dir's.
	r = run(t, []string{"ETCDCTL_ENDPOINTS=unix://" + filepath.Join(t.TempDir(), "none.sock"), "ETCDCTL_DIAL_TIMEOUT=500ms"}, "--data-dir", dataDir, "get", "/a")
	if r.err == nil {
		t.Errorf("ETCDCTL_ENDPOINTS was ignored: %s", r.stdout)
	}
	// No datastore: a hint, and etcdctl's own defaults.
	r = run(t, nil, "--data-dir", t.TempDir(), "version")
	if r.err != nil || !strings.Contains(r.stderr, "holds no datastore of a kelp server") || !strings.Contains(r.stdout, "etcdctl version") {
		t.Errorf("version without a datastore: %v\n%s%s", r.err, r.stdout, r.stderr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r = runContext(ctx, nil, "", "--data-dir", dataDir, "watch", "--rev=1", "--prefix", "/registry/pods/")
	if !strings.Contains(r.stdout, "PUT\n/registry/pods/default/my-pod\npod-1") || !strings.Contains(r.stdout, "DELETE\n/registry/pods/default/other") {
		t.Errorf("watch --rev=1 printed %q (%v, %s)", r.stdout, r.err, r.stderr)
	}
}

// TestKineCommands records which etcdctl commands kine answers; the README
// lists them.
func TestKineCommands(t *testing.T) {
	dataDir := t.TempDir()
	startDatastore(t, datastore.Config{DataDir: dataDir})
	ok(t, "--data-dir", dataDir, "put", "/registry/a", "one")
	ok(t, "--data-dir", dataDir, "put", "/registry/c", "to delete")
	cRev := modRevision(t, dataDir, "/registry/c")
	snap := filepath.Join(t.TempDir(), "snap.db")
	for _, tc := range []struct {
		args  []string
		stdin string
		works bool
	}{
		{args: []string{"get", "/registry/a"}, works: true},
		{args: []string{"get", "--prefix", "--keys-only", "/"}, works: true},
		{args: []string{"get", "--prefix", "--rev=2", "/registry/"}, works: true},
		{args: []string{"get", "--prefix", "--limit=1", "-w", "json", "/"}, works: true},
		{args: []string{"put", "/registry/b", "two"}, works: true},
		{args: []string{"put", "--prev-kv", "/registry/b", "three"}, works: true},
		{args: []string{"txn"}, stdin: deleteTxn("/registry/c", cRev), works: true},
		{args: []string{"del", "/registry/a"}, works: false},
		{args: []string{"del", "--prefix", "/registry/"}, works: false},
		{args: []string{"txn"}, stdin: "mod(\"/registry/a\") > \"0\"\n\nput /registry/a three\n\n\n", works: false},
		{args: []string{"endpoint", "status"}, works: true},
		{args: []string{"member", "list"}, works: true},
		{args: []string{"compaction", "2"}, works: true},
		{args: []string{"version"}, works: true},
		{args: []string{"lease", "grant", "60"}, works: true},
		{args: []string{"endpoint", "health"}, works: false},
		{args: []string{"alarm", "list"}, works: false},
		{args: []string{"defrag"}, works: false},
		{args: []string{"snapshot", "save", snap}, works: false},
		{args: []string{"lease", "list"}, works: false},
		{args: []string{"auth", "status"}, works: false},
		{args: []string{"user", "list"}, works: false},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r := runContext(ctx, nil, tc.stdin, append([]string{"--data-dir", dataDir, "--command-timeout=5s"}, tc.args...)...)
		cancel()
		t.Logf("%-40s works=%-5v %s %s", strings.Join(tc.args, " "), r.err == nil, firstLine(r.stdout), firstLine(r.stderr))
		if works := r.err == nil; works != tc.works {
			t.Errorf("etcdctl %s: works = %v, want %v (update the README)\nstdout: %s\nstderr: %s", strings.Join(tc.args, " "), works, tc.works, r.stdout, r.stderr)
		}
	}
}

// deleteTxn is the input of `etcdctl txn` that deletes key if its
// revision is rev, the only delete kine knows.
func deleteTxn(key string, rev int64) string {
	return fmt.Sprintf("mod(%q) = \"%d\"\n\ndel %s\n\nget %s\n\n", key, rev, key, key)
}

func modRevision(t *testing.T, dataDir, key string) int64 {
	t.Helper()
	var resp struct {
		Kvs []struct {
			ModRevision int64 `json:"mod_revision"`
		} `json:"kvs"`
	}
	if err := json.Unmarshal([]byte(ok(t, "--data-dir", dataDir, "get", "-w", "json", key)), &resp); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get -w json %s: %v %+v", key, err, resp)
	}
	return resp.Kvs[0].ModRevision
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// TestEmbeddedEtcd runs in a network namespace of its own, where
// etcd's default port 2379, which kelp etcdctl assumes, is free.
func TestEmbeddedEtcd(t *testing.T) {
	if os.Getenv(netnsEnv) == "" {
		if testing.Short() {
			t.Skip("starts embedded etcd")
		}
		if os.Geteuid() != 0 {
			t.Skip("needs root for a network namespace")
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestEmbeddedEtcd$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), netnsEnv+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
		out, err := cmd.CombinedOutput()
		t.Logf("in a network namespace:\n%s", out)
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("bring up lo: %v", err)
	}

	dataDir := t.TempDir()
	certs, err := pki.Ensure(pki.Config{
		Dir:           layout.Server(dataDir).TLS,
		Hostname:      "node-1",
		IPs:           []net.IP{net.ParseIP("127.0.0.1")},
		ServiceIP:     net.ParseIP("10.43.0.1"),
		ClusterDomain: "cluster.local",
	})
	if err != nil {
		t.Fatal(err)
	}
	startDatastore(t, datastore.Config{
		DataDir:     dataDir,
		ClusterInit: true,
		Name:        "node-1",
		AdvertiseIP: "127.0.0.1",
		EtcdTLS: datastore.EtcdTLS{
			ServerCA: certs.EtcdServerCA.Cert,
			Server:   certs.EtcdServer,
			PeerCA:   certs.EtcdPeerCA.Cert,
			Peer:     certs.EtcdPeer,
			Client:   certs.EtcdClient,
		},
	})

	ok(t, "--data-dir", dataDir, "put", "/registry/pods/default/my-pod", "pod-1")
	if got, want := ok(t, "--data-dir", dataDir, "get", "--prefix", "--keys-only", "/"), "/registry/pods/default/my-pod\n\n"; got != want {
		t.Errorf("get --prefix --keys-only / = %q, want %q", got, want)
	}
	if got := ok(t, "--data-dir", dataDir, "member", "list"); !strings.Contains(got, "node-1, https://127.0.0.1:2380, https://127.0.0.1:2379") {
		t.Errorf("member list = %q", got)
	}
	if got := ok(t, "--data-dir", dataDir, "endpoint", "status", "-w", "table"); !strings.Contains(got, "https://127.0.0.1:2379") || !strings.Contains(got, "DB SIZE") {
		t.Errorf("endpoint status = %q", got)
	}
	ok(t, "--data-dir", dataDir, "endpoint", "health")
	ok(t, "--data-dir", dataDir, "compaction", "2")
	if got := ok(t, "--data-dir", dataDir, "defrag"); !strings.Contains(got, "Finished defragmenting etcd member[https://127.0.0.1:2379]") {
		t.Errorf("defrag = %q", got)
	}
	snap := filepath.Join(t.TempDir(), "snap.db")
	ok(t, "--data-dir", dataDir, "snapshot", "save", snap)
	if got := ok(t, "snapshot", "status", "-w", "table", snap); !strings.Contains(got, "TOTAL KEYS") {
		t.Errorf("snapshot status = %q", got)
	}

	// Without the client certificate etcd refuses the connection: the
	// defaults are what make it work.
	r := run(t, []string{"ETCDCTL_CERT=/dev/null/none"}, "--data-dir", dataDir, "get", "/a")
	if r.err == nil {
		t.Errorf("ETCDCTL_CERT was ignored: %s", r.stdout)
	}
}
