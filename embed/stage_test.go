package embed

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// entry is one tar entry of a test bundle.
type entry struct {
	name     string
	typ      byte // tar.TypeReg unless set
	mode     int64
	data     string
	linkname string
}

type testBundle struct {
	data []byte
	hash string
}

func (b testBundle) reader() *countingReader {
	return &countingReader{r: bytes.NewReader(b.data)}
}

// countingReader tells whether stage read the archive, i.e. extracted it.
type countingReader struct {
	r *bytes.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// failingReader stands for an archive that must not be read.
type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("archive read on the fast path") }

func files(version string) []entry {
	return []entry{
		{name: "bin/runc", mode: 0o755, data: "runc " + version},
		{name: "bin/bridge", mode: 0o755, data: "bridge " + version},
		{name: "images/pause.tar", mode: 0o644, data: "pause image " + version},
	}
}

// manifestOf returns the MANIFEST entry describing files.
func manifestOf(files ...entry) entry {
	files = append([]entry(nil), files...)
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var b strings.Builder
	for _, f := range files {
		sum := sha256.Sum256([]byte(f.data))
		fmt.Fprintf(&b, "%s %d %s\n", hex.EncodeToString(sum[:]), len(f.data), f.name)
	}
	return entry{name: manifestName, mode: 0o644, data: b.String()}
}

// pack writes entries, in order, as a tar.zst.
func pack(t *testing.T, entries ...entry) testBundle {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		hdr := &tar.Header{Name: e.name, Typeflag: typ, Mode: e.mode, Linkname: e.linkname}
		if typ == tar.TypeReg {
			hdr.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return testBundle{data: buf.Bytes(), hash: hex.EncodeToString(sum[:])}
}

func goodBundle(t *testing.T, version string) testBundle {
	fs := files(version)
	return pack(t, append([]entry{manifestOf(fs...)}, fs...)...)
}

// dirEntries lists <dataDir>/data, without the lock file.
func dirEntries(t *testing.T, dataDir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dataDir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.Name() != lockName {
			names = append(names, e.Name())
		}
	}
	return names
}

func readlink(t *testing.T, dataDir, name string) string {
	t.Helper()
	target, err := os.Readlink(filepath.Join(dataDir, "data", name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return target
}

func sortedOf(s ...string) []string {
	sort.Strings(s)
	return s
}

func equal(a, b []string) bool {
	return strings.Join(a, "\n") == strings.Join(b, "\n")
}

func TestStageFresh(t *testing.T) {
	dataDir := t.TempDir()
	b := goodBundle(t, "v1")

	got, err := stage(dataDir, b.hash, b.reader())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(dataDir, "data", b.hash)
	want := Staged{
		Dir:           dir,
		BinDir:        filepath.Join(dir, "bin"),
		PauseImage:    PauseImage,
		PauseImageTar: filepath.Join(dir, "images", "pause.tar"),
	}
	if got != want {
		t.Fatalf("stage = %+v, want %+v", got, want)
	}
	for _, f := range files("v1") {
		p := filepath.Join(dir, f.name)
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != f.data {
			t.Errorf("%s = %q, want %q", f.name, data, f.data)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != os.FileMode(f.mode) {
			t.Errorf("%s mode = %v, want %v", f.name, fi.Mode().Perm(), os.FileMode(f.mode))
		}
	}
	if target := readlink(t, dataDir, currentLink); target != b.hash {
		t.Errorf("current -> %q, want %q", target, b.hash)
	}
	if names := dirEntries(t, dataDir); !equal(names, sortedOf(b.hash, currentLink)) {
		t.Errorf("data dir holds %v", names)
	}
}

func TestStageReusesStagedBundle(t *testing.T) {
	dataDir := t.TempDir()
	b := goodBundle(t, "v1")
	first, err := stage(dataDir, b.hash, b.reader())
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(first.Dir, markerName)
	before, err := os.Stat(marker)
	if err != nil {
		t.Fatal(err)
	}

	second, err := stage(dataDir, b.hash, failingReader{})
	if err != nil {
		t.Fatalf("second stage: %v", err)
	}
	if second != first {
		t.Errorf("second stage = %+v, want %+v", second, first)
	}
	after, err := os.Stat(marker)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Error("second stage rewrote the staged bundle")
	}
}

func TestStageNewBundleKeepsPreviousAndPrunesOlder(t *testing.T) {
	dataDir := t.TempDir()
	v1, v2, v3 := goodBundle(t, "v1"), goodBundle(t, "v2"), goodBundle(t, "v3")
	for _, b := range []testBundle{v1, v2, v3} {
		if _, err := stage(dataDir, b.hash, b.reader()); err != nil {
			t.Fatal(err)
		}
	}
	if names := dirEntries(t, dataDir); !equal(names, sortedOf(v2.hash, v3.hash, currentLink, previousLink)) {
		t.Errorf("after v1, v2, v3 the data dir holds %v, want v2 and v3 only", names)
	}
	if cur, prev := readlink(t, dataDir, currentLink), readlink(t, dataDir, previousLink); cur != v3.hash || prev != v2.hash {
		t.Errorf("current -> %s, previous -> %s; want v3 and v2", cur, prev)
	}

	// Going back to the previous bundle (a rollback) needs no extraction.
	got, err := stage(dataDir, v2.hash, failingReader{})
	if err != nil {
		t.Fatalf("rollback to v2: %v", err)
	}
	if got.Dir != filepath.Join(dataDir, "data", v2.hash) {
		t.Errorf("rollback staged %s", got.Dir)
	}
	if cur, prev := readlink(t, dataDir, currentLink), readlink(t, dataDir, previousLink); cur != v2.hash || prev != v3.hash {
		t.Errorf("after rollback current -> %s, previous -> %s; want v2 and v3", cur, prev)
	}
}

func TestStageRecoversFromCrash(t *testing.T) {
	dataDir := t.TempDir()
	b := goodBundle(t, "v1")
	root := filepath.Join(dataDir, "data")
	// A crash mid-extraction leaves a partial dir; one during a symlink swap
	// leaves a temporary link; a dir without its marker is unfinished too.
	partial := filepath.Join(root, b.hash+partialInfix+"123")
	if err := os.MkdirAll(filepath.Join(partial, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(partial, "bin", "runc"), []byte("half"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The temporary link is named as atomicfile names it.
	if err := os.Symlink("gone", filepath.Join(root, "."+currentLink+".tmp-123")); err != nil {
		t.Fatal(err)
	}
	unfinished := filepath.Join(root, b.hash)
	if err := os.MkdirAll(filepath.Join(unfinished, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(unfinished, "bin", "runc"), []byte("stale"), 0o755); err != nil {
		t.Fatal(err)
	}

	got, err := stage(dataDir, b.hash, b.reader())
	if err != nil {
		t.Fatal(err)
	}
	if names := dirEntries(t, dataDir); !equal(names, sortedOf(b.hash, currentLink)) {
		t.Errorf("data dir holds %v, want the leftovers gone", names)
	}
	runc, err := os.ReadFile(filepath.Join(got.BinDir, "runc"))
	if err != nil {
		t.Fatal(err)
	}
	if string(runc) != "runc v1" {
		t.Errorf("bin/runc = %q, want it re-extracted", runc)
	}
}

func TestStageRejectsCorruptBundles(t *testing.T) {
	good := files("v1")
	manifest := manifestOf(good...)
	withData := func(name, data string) []entry {
		out := append([]entry(nil), good...)
		for i := range out {
			if out[i].name == name {
				out[i].data = data
			}
		}
		return out
	}
	evil := entry{name: "../evil", mode: 0o755, data: "x"}
	abs := entry{name: "/tmp/evil", mode: 0o755, data: "x"}
	link := entry{name: "bin/link", typ: tar.TypeSymlink, linkname: "/etc/passwd"}

	tests := []struct {
		name    string
		entries []entry
		hash    string // defaults to the archive's own hash
		wantErr string
	}{
		{
			name:    "content differs from MANIFEST",
			entries: append([]entry{manifest}, withData("bin/runc", "RUNC v1")...),
			wantErr: "bin/runc has sha256",
		},
		{
			name:    "size differs from MANIFEST",
			entries: append([]entry{manifest}, withData("bin/runc", "runc v1 and more")...),
			wantErr: "bin/runc has 16 bytes, MANIFEST says 7",
		},
		{
			name:    "path escapes with ..",
			entries: append([]entry{manifestOf(append(good, evil)...)}, append(good, evil)...),
			wantErr: `path "../evil" leaves the bundle dir`,
		},
		{
			name:    "absolute path",
			entries: append([]entry{manifestOf(append(good, abs)...)}, append(good, abs)...),
			wantErr: `path "/tmp/evil" leaves the bundle dir`,
		},
		{
			name:    "file not in MANIFEST",
			entries: append([]entry{manifest}, append(good, entry{name: "bin/extra", data: "x"})...),
			wantErr: "bin/extra is not in MANIFEST",
		},
		{
			name:    "file missing from archive",
			entries: []entry{manifest, good[0], good[1]},
			wantErr: "images/pause.tar is in MANIFEST but not in the archive",
		},
		{
			name:    "symlink",
			entries: append([]entry{manifestOf(append(good, entry{name: "bin/link"})...)}, append(good, link)...),
			wantErr: "bin/link is not a regular file",
		},
		{
			name:    "MANIFEST not first",
			entries: append(append([]entry(nil), good...), manifest),
			wantErr: `first entry is "bin/runc", want MANIFEST`,
		},
		{
			name:    "archive hash differs",
			entries: append([]entry{manifest}, good...),
			hash:    strings.Repeat("ab", 32),
			wantErr: "archive sha256 is",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dataDir := t.TempDir()
			// A good bundle staged before must survive a bad one.
			old := goodBundle(t, "v0")
			if _, err := stage(dataDir, old.hash, old.reader()); err != nil {
				t.Fatal(err)
			}
			b := pack(t, tt.entries...)
			hash := b.hash
			if tt.hash != "" {
				hash = tt.hash
			}

			_, err := stage(dataDir, hash, b.reader())
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("stage error = %v, want ErrCorrupt mentioning %q", err, tt.wantErr)
			}
			if names := dirEntries(t, dataDir); !equal(names, sortedOf(old.hash, currentLink)) {
				t.Errorf("after a failed stage the data dir holds %v", names)
			}
			if cur := readlink(t, dataDir, currentLink); cur != old.hash {
				t.Errorf("current -> %s, want the old bundle", cur)
			}
			if _, err := os.Stat(filepath.Join(dataDir, "evil")); err == nil {
				t.Error("a file escaped the bundle dir")
			}
		})
	}
}

func TestStageRejectsTruncatedArchive(t *testing.T) {
	dataDir := t.TempDir()
	b := goodBundle(t, "v1")
	truncated := bytes.NewReader(b.data[:len(b.data)/2])
	_, err := stage(dataDir, b.hash, truncated)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("stage error = %v, want ErrCorrupt", err)
	}
	if names := dirEntries(t, dataDir); len(names) != 0 {
		t.Errorf("after a failed stage the data dir holds %v", names)
	}
}

// Files in nested dirs are staged; each dir made on the way is synced.
func TestStageNestedDirs(t *testing.T) {
	dataDir := t.TempDir()
	fs := append(files("v1"), entry{name: "share/doc/runc/LICENSE", mode: 0o644, data: "license"})
	b := pack(t, append([]entry{manifestOf(fs...)}, fs...)...)
	got, err := stage(dataDir, b.hash, b.reader())
	if err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(got.Dir, "share", "doc", "runc", "LICENSE")); err != nil || string(data) != "license" {
		t.Errorf("share/doc/runc/LICENSE = %q, %v", data, err)
	}
}

func TestStageConcurrentCallsExtractOnce(t *testing.T) {
	dataDir := t.TempDir()
	b := goodBundle(t, "v1")
	const n = 8
	readers := make([]*countingReader, n)
	results := make([]Staged, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		readers[i] = b.reader()
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = stage(dataDir, b.hash, readers[i])
		}()
	}
	wg.Wait()

	extractions := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("stage %d: %v", i, errs[i])
		}
		if results[i] != results[0] {
			t.Errorf("stage %d = %+v, stage 0 = %+v", i, results[i], results[0])
		}
		if readers[i].n > 0 {
			extractions++
		}
	}
	if extractions != 1 {
		t.Errorf("%d of %d concurrent stages extracted the bundle, want 1", extractions, n)
	}
}

func TestStageWaitsForLock(t *testing.T) {
	dataDir := t.TempDir()
	b := goodBundle(t, "v1")
	if err := os.MkdirAll(filepath.Join(dataDir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	unlock, err := lock(filepath.Join(dataDir, "data", lockName))
	if err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() {
		_, err := stage(dataDir, b.hash, b.reader())
		done <- err
	}()
	select {
	case err := <-done:
		unlock()
		t.Fatalf("stage finished while another holder had the lock (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// childResult is what TestStageChildProcess reports to its parent.
type childResult struct {
	Staged    Staged
	BytesRead int
}

// TestStageChildProcess is the other kelp process of
// TestStageTwoProcessesExtractOnce; it does nothing when run on its own.
func TestStageChildProcess(t *testing.T) {
	dataDir, archive, hash := os.Getenv("KELP_STAGE_DATA_DIR"), os.Getenv("KELP_STAGE_ARCHIVE"), os.Getenv("KELP_STAGE_HASH")
	if dataDir == "" {
		t.Skip("only run as a child of TestStageTwoProcessesExtractOnce")
	}
	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	r := &countingReader{r: bytes.NewReader(data)}
	staged, err := stage(dataDir, hash, r)
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(childResult{Staged: staged, BytesRead: r.n})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("RESULT %s\n", out)
}

func TestStageTwoProcessesExtractOnce(t *testing.T) {
	dataDir := t.TempDir()
	b := goodBundle(t, "v1")
	archive := filepath.Join(t.TempDir(), "bundle.tar.zst")
	if err := os.WriteFile(archive, b.data, 0o644); err != nil {
		t.Fatal(err)
	}
	// Hold the lock while both children start, so that they contend for it.
	if err := os.MkdirAll(filepath.Join(dataDir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	unlock, err := lock(filepath.Join(dataDir, "data", lockName))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestStageChildProcess$", "-test.v")
		cmd.Env = append(os.Environ(),
			"KELP_STAGE_DATA_DIR="+dataDir, "KELP_STAGE_ARCHIVE="+archive, "KELP_STAGE_HASH="+b.hash)
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			unlock()
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	time.Sleep(300 * time.Millisecond)
	unlock()

	var results []childResult
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, outs[i])
		}
		_, line, ok := strings.Cut(outs[i].String(), "RESULT ")
		if !ok {
			t.Fatalf("child %d printed no result:\n%s", i, outs[i])
		}
		line, _, _ = strings.Cut(line, "\n")
		var r childResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
	}
	if results[0].Staged != results[1].Staged {
		t.Errorf("children staged %+v and %+v", results[0].Staged, results[1].Staged)
	}
	if extracted := (results[0].BytesRead > 0) != (results[1].BytesRead > 0); !extracted {
		t.Errorf("children read %d and %d archive bytes, want exactly one to extract", results[0].BytesRead, results[1].BytesRead)
	}
}

func TestStageRejectsBadHash(t *testing.T) {
	for _, hash := range []string{"", "../x", strings.Repeat("A", 64), strings.Repeat("a", 63)} {
		if _, err := stage(t.TempDir(), hash, failingReader{}); err == nil {
			t.Errorf("stage with hash %q succeeded", hash)
		}
	}
}
