package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/layout"
)

// newKelp is a script that says it is a kelp, as --version does.
const newKelp = "#!/bin/sh\nprintf 'kelp v9.9.9 (test)\\nkubernetes v1.36.3\\n'\n"

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// testNode is a node's data dir with the new kelp in its upgrades dir,
// and a bin dir with the running kelp.
type testNode struct {
	dataDir, bin string
}

func newTestNode(t *testing.T) testNode {
	dir := t.TempDir()
	n := testNode{dataDir: filepath.Join(dir, "data"), bin: filepath.Join(dir, "bin", "kelp")}
	for _, d := range []string{layout.Agent(n.dataDir).Upgrades, filepath.Dir(n.bin)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(layout.Agent(n.dataDir).Upgrades, "kelp-new"), newKelp)
	write(t, n.bin, "the running kelp")
	return n
}

// valid is spec with its defaults, as the executor gets it.
func valid(t *testing.T, spec Spec) Spec {
	t.Helper()
	v, err := spec.Validate()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}

func read(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(data)
}

// leftovers are the files in dir other than want.
func leftovers(t *testing.T, dir string, want ...string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !strings.Contains(strings.Join(want, "\x00"), e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestApplySwaps(t *testing.T) {
	n := newTestNode(t)
	e := Executor{DataDir: n.dataDir, Binary: n.bin}
	err := e.apply(context.Background(), "up1/"+sum(newKelp), valid(t, Spec{SHA256: sum(newKelp), Path: "kelp-new"}))
	var restart *RestartError
	if !errors.As(err, &restart) || restart.Binary != n.bin {
		t.Fatalf("apply = %v, want a restart into %s", err, n.bin)
	}
	if read(n.bin) != newKelp || read(filepath.Join(filepath.Dir(n.bin), "kelp.previous")) != "the running kelp" {
		t.Errorf("after the swap kelp is %q and kelp.previous %q", read(n.bin), read(filepath.Join(filepath.Dir(n.bin), "kelp.previous")))
	}
	if left := leftovers(t, filepath.Dir(n.bin), "kelp", "kelp.previous"); len(left) > 0 {
		t.Errorf("left in the bin dir: %v", left)
	}
	var p pending
	if err := json.Unmarshal([]byte(read(layout.Agent(n.dataDir).UpgradePending)), &p); err != nil || p.SHA256 != sum(newKelp) || p.Request != "up1/"+sum(newKelp) {
		t.Errorf("pending record %+v, %v", p, err)
	}
	// The next start reports the new kelp.
	res, err := e.result(p)
	if err != nil || !res.OK || res.Request != p.Request {
		t.Errorf("result after the swap: %+v, %v", res, err)
	}
}

func TestApplyRefuses(t *testing.T) {
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	missing := httptest.NewServer(http.NotFoundHandler())
	defer missing.Close()
	notKelp := "#!/bin/sh\nexit 3\n"
	for _, tc := range []struct {
		name string
		spec Spec
		want string
	}{
		{"checksum mismatch", Spec{SHA256: sum("something else"), Path: "kelp-new"}, "not spec.sha256"},
		{"no such file", Spec{SHA256: sum(newKelp), Path: "kelp-none"}, "copy it there on every node"},
		{"path outside", Spec{SHA256: sum(newKelp), Path: "/usr/local/bin/kelp"}, "is not in this node's"},
		{"URL not answering", Spec{SHA256: sum(newKelp), URL: closed.URL + "/kelp", AllowHTTP: true}, "check that this node reaches it"},
		{"URL 404", Spec{SHA256: sum(newKelp), URL: missing.URL + "/kelp", AllowHTTP: true}, "404 Not Found"},
		{"does not run", Spec{SHA256: sum(notKelp), Path: "not-kelp"}, "does not run here"},
		{"no way back", Spec{SHA256: sum(newKelp), Path: "kelp-new"}, "--upgrade-attempts 0"},
	} {
		n := newTestNode(t)
		write(t, filepath.Join(layout.Agent(n.dataDir).Upgrades, "not-kelp"), notKelp)
		e := Executor{DataDir: n.dataDir, Binary: n.bin, NoRollback: tc.name == "no way back"}
		err := e.apply(context.Background(), "up/"+tc.spec.SHA256, valid(t, tc.spec))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
		if read(n.bin) != "the running kelp" {
			t.Errorf("%s: kelp was replaced", tc.name)
		}
		if left := leftovers(t, filepath.Dir(n.bin), "kelp"); len(left) > 0 {
			t.Errorf("%s: left in the bin dir: %v", tc.name, left)
		}
		if _, err := os.Stat(layout.Agent(n.dataDir).UpgradePending); !os.IsNotExist(err) {
			t.Errorf("%s: an upgrade is recorded as pending: %v", tc.name, err)
		}
	}
}

func TestCheckNotOlder(t *testing.T) {
	if err := checkNotOlder("v1.35.2", "v1.36.3"); err == nil || !strings.Contains(err.Error(), "older minor") {
		t.Errorf("an older minor: %v", err)
	}
	for _, v := range []string{"v1.36.0", "v1.37.1"} {
		if err := checkNotOlder(v, "v1.36.3"); err != nil {
			t.Errorf("%s over v1.36.3: %v", v, err)
		}
	}
}

// A node that comes back on its earlier kelp says why: the boot guard's
// rollback, from its record.
func TestResultAfterRollback(t *testing.T) {
	n := newTestNode(t)
	p := pending{Request: "up1/" + sum(newKelp), SHA256: sum(newKelp), At: time.Now().Add(-time.Minute).UTC()}
	e := Executor{DataDir: n.dataDir, Binary: n.bin}
	res, err := e.result(p)
	if err != nil || res.OK || !strings.Contains(res.Message, "runs its earlier kelp again") {
		t.Errorf("without a rollback recorded: %+v, %v", res, err)
	}
	record := `{"rolledBack":{"from":{"kelp":"v1.0.0","kubernetes":"v1.36.3"},"to":{"kelp":"v9.9.9","kubernetes":"v1.36.3"},"at":"` +
		time.Now().UTC().Format(time.RFC3339) + `","reason":"its 3 starts ended before it became ready, the last with: boom","steps":["kelp is the kelp that was kelp.previous again"]}}`
	if err := os.WriteFile(layout.BootGuard(n.dataDir), []byte(record), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err = e.result(p)
	if err != nil || res.OK || !strings.Contains(res.Message, "boot guard rolled back from kelp v9.9.9") || !strings.Contains(res.Message, "the last with: boom") {
		t.Errorf("after the boot guard's rollback: %+v, %v", res, err)
	}
}

// TestApplyDiskFull: a new kelp that does not fit beside the running one
// is refused saying so, and nothing is swapped or left behind.
func TestApplyDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	n := newTestNode(t)
	binDir := filepath.Dir(n.bin)
	if err := unix.Mount("tmpfs", binDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64k,mode=0755"); err != nil {
		t.Skipf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(binDir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", binDir, err)
		}
	})
	write(t, n.bin, "the running kelp")
	big := newKelp + "# " + strings.Repeat("x", 1<<20) + "\n"
	write(t, filepath.Join(layout.Agent(n.dataDir).Upgrades, "kelp-big"), big)

	e := Executor{DataDir: n.dataDir, Binary: n.bin}
	err := e.apply(context.Background(), "up/"+sum(big), valid(t, Spec{SHA256: sum(big), Path: "kelp-big"}))
	if err == nil || !strings.Contains(err.Error(), "the disk is full: free space there") {
		t.Fatalf("a new kelp larger than the bin dir's free space: %v", err)
	}
	if read(n.bin) != "the running kelp" {
		t.Errorf("kelp was replaced")
	}
	if left := leftovers(t, binDir, "kelp"); len(left) > 0 {
		t.Errorf("left in the bin dir: %v", left)
	}
	if _, err := os.Stat(layout.Agent(n.dataDir).UpgradePending); !os.IsNotExist(err) {
		t.Errorf("an upgrade is recorded as pending: %v", err)
	}
}
