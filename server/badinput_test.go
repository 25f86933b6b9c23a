package server_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestBadInput runs kelp server with each mistake a user can make and
// checks the error says what is wrong and that nothing was lost.
func TestBadInput(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	fail := func(t *testing.T, args []string, want ...string) string {
		t.Helper()
		out, err := n.RunKelp(90*time.Second, args...)
		if code := testcluster.ExitCode(err); code != 1 {
			t.Fatalf("exit code %d (%v), want 1; output:\n%s", code, err, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("output lacks %q:\n%s", w, out)
			}
		}
		return out
	}
	write := func(name, content string) string {
		path := filepath.Join(n.Dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	t.Run("missing memory cgroup", func(t *testing.T) {
		// A Raspberry Pi kernel without cgroup_enable=memory: the memory
		// controller is listed but disabled.
		data, err := os.ReadFile("/proc/cgroups")
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			if f := strings.Fields(line); len(f) == 4 && f[0] == "memory" {
				line = "memory\t0\t1\t0"
			}
			lines = append(lines, line)
		}
		fake := write("cgroups", strings.Join(lines, "\n")+"\n")
		if out, err := n.Run(time.Minute, n.Command("mount", "--bind", fake, "/proc/cgroups")); err != nil {
			t.Fatalf("mount: %v %s", err, out)
		}
		defer n.Run(time.Minute, n.Command("umount", "/proc/cgroups"))
		out := fail(t, []string{"check-config"}, "FAIL  cgroup memory", "cgroup_enable=memory cgroup_memory=1")
		if !strings.Contains(out, "ok    nf_tables") {
			t.Errorf("check-config does not report the other checks:\n%s", out)
		}
		fail(t, []string{"server", "--data-dir", n.DataDir}, "cannot run a kelp node", "cgroup_enable=memory cgroup_memory=1")
	})
	t.Run("malformed registries.yaml", func(t *testing.T) {
		reg := write("registries.yaml", "mirrors:\n  docker.io:\n    endpoints: [\"https://mirror.example\"]\n")
		fail(t, []string{"server", "--data-dir", n.DataDir, "--write-kubeconfig", n.Kubeconfig, "--private-registry", reg}, "registries.yaml", `unknown field "endpoints"`)
	})
	t.Run("port in use", func(t *testing.T) {
		l, err := n.Listen("tcp", "0.0.0.0:6443")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		fail(t, n.ServerArgs(), "port 6443", "not free", "--https-listen-port")
	})
	t.Run("data dir not writable", func(t *testing.T) {
		dir := filepath.Join(n.Dir, "readonly")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		// Mounted in the node's own mount namespace: gone with the node.
		if out, err := n.Run(time.Minute, n.Command("mount", "-t", "tmpfs", "-o", "ro", "kelp-test", dir)); err != nil {
			t.Fatalf("mount: %v %s", err, out)
		}
		fail(t, []string{"server", "--disable-agent", "--data-dir", filepath.Join(dir, "kelp")}, "not writable", "--data-dir")
	})
	t.Run("malformed config", func(t *testing.T) {
		cfg := write("malformed.yaml", "cluster-cidr: [10.42.0.0/16\n")
		fail(t, n.ServerArgs("--config", cfg), "malformed.yaml", "not valid YAML")
	})
	t.Run("unknown config key", func(t *testing.T) {
		cfg := write("unknown.yaml", "cluster-cidr: 10.42.0.0/16\nclustr-dns: 10.43.0.10\n")
		fail(t, n.ServerArgs("--config", cfg), "unknown.yaml line 2", `unknown key "clustr-dns"`)
	})
	t.Run("invalid CIDR", func(t *testing.T) {
		fail(t, n.ServerArgs("--cluster-cidr", "10.42.0.0/40"), "--cluster-cidr", "not a CIDR")
	})
	t.Run("overlapping CIDRs", func(t *testing.T) {
		fail(t, n.ServerArgs("--cluster-cidr", "10.0.0.0/8", "--service-cidr", "10.43.0.0/16"), "overlaps")
	})
	t.Run("invalid node name", func(t *testing.T) {
		// The later --node-name beats the one ServerArgs passes.
		fail(t, n.ServerArgs("--node-name", "a_b"), `--node-name "a_b" is not a valid node name`, "pass --node-name")
	})
	t.Run("not root", func(t *testing.T) {
		out, err := n.Run(time.Minute, n.CommandAs(65534, 65534, testcluster.Binary(t), n.ServerArgs()...))
		if err == nil || !strings.Contains(out, "must run as root") {
			t.Errorf("got %v:\n%s", err, out)
		}
	})
	t.Run("corrupt state.db", func(t *testing.T) {
		dataDir := filepath.Join(n.Dir, "corrupt")
		db := filepath.Join(dataDir, "server", "db", "state.db")
		if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
			t.Fatal(err)
		}
		garbage := bytes.Repeat([]byte("not a database, but someone's only copy of it\n"), 200)
		if err := os.WriteFile(db, garbage, 0o600); err != nil {
			t.Fatal(err)
		}
		fail(t, []string{"server", "--disable-agent", "--data-dir", dataDir, "--write-kubeconfig", n.Kubeconfig}, "state.db")
		after, err := os.ReadFile(db)
		if err != nil || !bytes.Equal(after, garbage) {
			t.Errorf("state.db was changed or removed (%v)", err)
		}
	})
	t.Run("unreachable external datastore", func(t *testing.T) {
		// Nothing routes 10.99.0.99 inside the node: the connection fails.
		out := fail(t, n.ServerArgs("--datastore-endpoint", "postgres://kelp:secret-pw@10.99.0.99:5432/kelp?sslmode=disable"), "10.99.0.99")
		if strings.Contains(out, "secret-pw") {
			t.Errorf("the password leaked into the output:\n%s", out)
		}
	})
}
