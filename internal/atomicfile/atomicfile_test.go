package atomicfile

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// Not parallel: the umask is process-wide.
func TestWrite(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)

	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	for _, w := range []struct {
		content string
		mode    os.FileMode
	}{{"first", 0o600}, {"second", 0o644}, {"", 0o640}} {
		if err := Write(path, []byte(w.content), w.mode); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != w.content || st.Mode().Perm() != w.mode {
			t.Errorf("after writing %q with %04o: %q %04o", w.content, w.mode, data, st.Mode().Perm())
		}
	}
	if got := names(t, dir); !slices.Equal(got, []string{"token"}) {
		t.Errorf("temporary files left: %v", got)
	}
	if err := Write(filepath.Join(dir, "missing", "x"), nil, 0o600); err == nil {
		t.Error("a missing directory: no error")
	}
}

// A write that cannot be renamed into place leaves nothing behind.
func TestWriteFailureLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "conf")
	if err := os.MkdirAll(filepath.Join(target, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(target, []byte("data"), 0o600); err == nil {
		t.Fatal("writing over a directory: no error")
	}
	if got := names(t, dir); !slices.Equal(got, []string{"conf"}) {
		t.Errorf("directory holds %v after a failed write", got)
	}
}

func TestSymlink(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "current")
	// A regular file in the link's place is replaced too.
	if err := os.WriteFile(link, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"aaa", "bbb"} {
		if err := Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		if got, err := os.Readlink(link); err != nil || got != target {
			t.Errorf("current -> %q, %v; want %q", got, err, target)
		}
	}
	if got := names(t, dir); !slices.Equal(got, []string{"current"}) {
		t.Errorf("temporary links left: %v", got)
	}
}

func TestSyncDir(t *testing.T) {
	if err := SyncDir(t.TempDir()); err != nil {
		t.Error(err)
	}
	if err := SyncDir(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing directory: no error")
	}
}

// RemoveTemps finds what a crash between creating a temporary file and
// renaming it leaves, and nothing else.
func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	leftover, err := os.CreateTemp(dir, tempPrefix(filepath.Join(dir, "server-ca.key"))+"*")
	if err != nil {
		t.Fatal(err)
	}
	leftover.Close()
	if err := os.Symlink("gone", filepath.Join(dir, tempPrefix("current")+"x1")); err != nil {
		t.Fatal(err)
	}
	keep := []string{".lock", ".partial.tmp-dir", "server-ca.key", "token.tmp-1"}
	for _, name := range keep {
		var err error
		if name == ".partial.tmp-dir" {
			err = os.Mkdir(filepath.Join(dir, name), 0o700)
		} else {
			err = os.WriteFile(filepath.Join(dir, name), nil, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := RemoveTemps(dir); err != nil {
		t.Fatal(err)
	}
	if got := names(t, dir); !slices.Equal(got, keep) {
		t.Errorf("after RemoveTemps: %v, want %v", got, keep)
	}
	if err := RemoveTemps(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing directory: no error")
	}
}
