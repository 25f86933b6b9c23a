package images

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestIsTarball(t *testing.T) {
	for name, want := range map[string]bool{
		"app.tar": true, "app.tar.gz": true, "app.tgz": true, "app.tar.zst": true,
		"app.zst": false, "app.tar.xz": false, "README": false, ".app.tar.tmp": false,
	} {
		if got := IsTarball(name); got != want {
			t.Errorf("IsTarball(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestState(t *testing.T) {
	dir := t.TempDir()
	im := Importer{StatePath: filepath.Join(dir, "kelp-airgap-images.json")}
	if got := im.loadState(); len(got) != 0 {
		t.Errorf("no state file: %v", got)
	}
	want := map[string]imported{
		"app.tar": {Size: 42, ModTime: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), Images: []string{"docker.io/library/app:1"}},
	}
	if err := im.saveState(want); err != nil {
		t.Fatal(err)
	}
	if got := im.loadState(); !reflect.DeepEqual(got, want) {
		t.Errorf("state read back as %v, want %v", got, want)
	}
	st, err := os.Stat(im.StatePath)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("state file mode %04o, want 0600", st.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}

	// A damaged state costs a re-import, not a failure.
	if err := os.WriteFile(im.StatePath, []byte(`{"app.tar": {"size": `), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := im.loadState(); len(got) != 0 {
		t.Errorf("damaged state read as %v", got)
	}
}

func TestSyncDirWithoutTarballs(t *testing.T) {
	dir := t.TempDir()
	im := Importer{StatePath: filepath.Join(t.TempDir(), "state.json")}
	if err := im.SyncDir(t.Context(), filepath.Join(dir, "missing")); err != nil {
		t.Errorf("a missing directory: %v", err)
	}
	if _, err := os.Stat(im.StatePath); !os.IsNotExist(err) {
		t.Errorf("a missing directory wrote the state (err %v)", err)
	}

	// Tarballs removed from the directory are forgotten; what is not a
	// tarball file is not imported (no containerd is needed to tell).
	if err := im.saveState(map[string]imported{"gone.tar": {Size: 1, Images: []string{"gone:1"}}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not an image"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "dir.tar"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := im.SyncDir(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
	if got := im.loadState(); len(got) != 0 {
		t.Errorf("state after the tarball went: %v", got)
	}
}

func TestImportFileUnreadable(t *testing.T) {
	dir := t.TempDir()
	im := Importer{}
	bad := filepath.Join(dir, "app.tar.gz")
	if err := os.WriteFile(bad, []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{bad: "not gzip", filepath.Join(dir, "missing.tar"): "no such file"} {
		_, err := im.ImportFile(t.Context(), path)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
			t.Errorf("ImportFile(%s): %v, want an error naming the file and saying %q", filepath.Base(path), err, want)
		}
	}
}
