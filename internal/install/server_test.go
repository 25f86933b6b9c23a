package install

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// realRelease is where the real kelp's release artifacts are made: the
// binary under test as v9.0.0, and the same plus one byte as v9.0.1, an
// upgrade that differs from it.
const realRelease = "/tmp/kelp-install-test"

// TestInstalledServer installs the real kelp from a zstd release on the
// local mirror, starts `kelp server` the way the unit's ExecStart and
// env file say, waits for its node to be Ready, upgrades it while it
// runs, and uninstalls it: nothing is left.
func TestInstalledServer(t *testing.T) {
	testcluster.NeedRoot(t)
	bin := testcluster.Binary(t)
	if err := os.RemoveAll(realRelease); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(realRelease) })
	if err := os.MkdirAll(realRelease, 0o755); err != nil {
		t.Fatal(err)
	}
	// A copy: the binary under test may be rebuilt while this runs.
	kelpBin := filepath.Join(realRelease, "kelp")
	copyFile(t, bin, kelpBin)
	v1, err := os.ReadFile(kelpBin)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	mirror := filepath.Join(realRelease, "mirror")
	release(t, filepath.Join(mirror, "releases", "download", "v9.0.0"), map[string][]byte{"amd64": v1}, true)
	v2 := append(v1[:len(v1):len(v1)], '\n')
	release(t, filepath.Join(mirror, "releases", "download", "v9.0.1"), map[string][]byte{"amd64": v2}, true)
	zst, _ := os.Stat(filepath.Join(mirror, "releases", "download", "v9.0.0", "kelp-linux-amd64.zst"))
	t.Logf("release: %d MiB binary, %d MiB zstd (-3), made in %.1f s", len(v1)>>20, zst.Size()>>20, time.Since(start).Seconds())

	s := newSandbox(t, systemd, mirror)
	// testcluster's cleanup runs kelp killall on this data dir: a test
	// that fails half-way leaves no containers behind.
	s.n.Agent = true
	start = time.Now()
	s.mustInstall(run{
		args: []string{"server", "--data-dir", s.n.DataDir, "--node-name", testcluster.NodeName, "--write-kubeconfig", s.n.Kubeconfig},
		env:  []string{"INSTALL_KELP_VERSION=v9.0.0", "KELP_TOKEN=install-test-token"},
	})
	t.Logf("install from the local mirror: %.1f s", time.Since(start).Seconds())
	unit := s.read("/etc/systemd/system/kelp.service")
	verifyUnit(t, s, "/etc/systemd/system/kelp.service")
	argv, err := sdSplit(unitValue(unit, "ExecStart"))
	if err != nil {
		t.Fatal(err)
	}

	// What systemd would do: the env file's settings, then ExecStart.
	logPath := filepath.Join(s.dir, "kelp.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	envFile := unitValue(unit, "EnvironmentFile")[1:]
	cmd := s.n.Command("/bin/sh", append([]string{"-c", `set -a; . "$0"; set +a; exec "$@"`, envFile}, argv...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	running := true
	t.Cleanup(func() {
		if running {
			_ = stopProcess(cmd, done)
		}
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			if len(data) > 20000 {
				data = data[len(data)-20000:]
			}
			t.Logf("kelp log (end):\n%s", data)
		}
	})
	start = time.Now()
	waitNodeReady(t, s, done, 2*time.Minute)
	t.Logf("installed kelp server: node Ready %.1f s after start", time.Since(start).Seconds())

	// A second install while kelp runs: the binary is replaced by a
	// rename (writing into a running binary fails with ETXTBSY), the old
	// one kept, and kelp goes on.
	s.resetCalls()
	s.mustInstall(run{env: []string{"INSTALL_KELP_VERSION=v9.0.1"}})
	if sha([]byte(s.read("/usr/local/bin/kelp"))) != sha(v2) || sha([]byte(s.read("/usr/local/bin/kelp.previous"))) != sha(v1) {
		t.Error("after the upgrade kelp is not v9.0.1, or kelp.previous is not v9.0.0")
	}
	if s.read("/etc/systemd/system/kelp.service") != unit {
		t.Error("the upgrade changed the unit")
	}
	wantCalls(t, s, "systemctl daemon-reload", "systemctl enable kelp", "systemctl restart kelp")
	waitNodeReady(t, s, done, 30*time.Second)
	if out, err := s.n.Run(time.Minute, s.n.Command("/usr/local/bin/kelp", "--version")); err != nil {
		t.Errorf("upgraded kelp --version: %v\n%s", err, out)
	}

	running = false
	if err := stopProcess(cmd, done); err != nil {
		t.Errorf("kelp server: %v", err)
	}
	if _, err := s.uninstall("/usr/local/bin/kelp-uninstall.sh"); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	// The uninstaller ran kelp killall and removed the data dir.
	s.n.Agent = false
	if left := s.leftovers(s.n.DataDir, "/var/log/pods", "/var/log/containers"); len(left) > 0 {
		t.Errorf("left behind: %q", left)
	}
	if _, err := os.Stat(s.n.DataDir); !os.IsNotExist(err) {
		t.Errorf("data dir %s: %v, want it removed", s.n.DataDir, err)
	}
}

// waitNodeReady waits until the node of the sandbox's server is Ready.
// A kelp that exits fails the test; its exit stays in exited for whoever
// waits for it next.
func waitNodeReady(t *testing.T, s *sandbox, exited chan error, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("kelp server exited: %v", err)
		default:
		}
		if _, err := os.Stat(s.n.Kubeconfig); err != nil {
			return false, nil
		}
		nodes, err := s.n.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(nodes.Items) != 1 {
			return false, nil
		}
		for _, c := range nodes.Items[0].Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("node not Ready within %s: %v", timeout, err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
