package machine

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPrivateMountsKeepSources: a cluster node's private paths come from
// below the host's /var/lib/kelp (the default cluster root), which is one
// of them. It is mounted last, so the other sources are still there when
// they are bound.
func TestPrivateMountsKeepSources(t *testing.T) {
	root := t.TempDir()
	kelp, kubelet, logs, run := filepath.Join(root, "kelp"), filepath.Join(root, "kubelet"), filepath.Join(root, "log"), filepath.Join(root, "run")
	node := filepath.Join(kelp, "clusters", "ci", "nodes", "server-1")
	script, err := privateMounts(map[string]string{
		kelp:    filepath.Join(node, "data"),
		kubelet: filepath.Join(node, "kubelet"),
		logs:    filepath.Join(node, "log"),
		run:     "",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"mount --bind '" + filepath.Join(node, "kubelet") + "' " + kubelet,
		"mount --bind '" + filepath.Join(node, "log") + "' " + logs,
		"mount -t tmpfs -o mode=0755 kelp-machine " + run,
		"mount --bind '" + filepath.Join(node, "data") + "' " + kelp,
	}
	if !slices.Equal(script, want) {
		t.Errorf("mounts:\n  %s\nwant:\n  %s", strings.Join(script, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestPrivateMountsRefuseCrossedSources: two paths, each mapped from below
// the other, have no order that keeps both sources: refused, not mounted
// wrong.
func TestPrivateMountsRefuseCrossedSources(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	_, err := privateMounts(map[string]string{a: filepath.Join(b, "x"), b: filepath.Join(a, "y")})
	if err == nil || !strings.Contains(err.Error(), "hides sources") {
		t.Errorf("crossed sources: got %v, want an error that says so", err)
	}
}
