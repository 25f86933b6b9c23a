//go:build unix

package pki

import (
	"os"
	"syscall"
	"testing"
)

// Not parallel: the umask is process-wide.
func TestEnsureModesIgnoreUmask(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)

	cfg := testConfig(t)
	f, _ := run(t, cfg)
	for _, p := range f.all() {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %04o, want 0600", p, st.Mode().Perm())
		}
	}

	// A mode loosened by hand is tightened without touching the content.
	if err := os.Chmod(f.ServerCA.Key, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(cfg.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, f)
	run(t, cfg)
	for path, want := range map[string]os.FileMode{f.ServerCA.Key: 0o600, cfg.Dir: 0o700} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s mode = %04o, want %04o", path, st.Mode().Perm(), want)
		}
	}
	if got := changed(before, snapshot(t, f)); len(got) > 0 {
		t.Errorf("changed %v", got)
	}
}
