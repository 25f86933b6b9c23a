package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path  string
		limit int64
		want  string // error; "": the content
	}{
		{fifo, 10, "not a regular file"},
		{dir, 10, "not a regular file"},
		{"/dev/null", 10, "not a regular file"},
		{good, 4, "larger than 4 bytes"},
		{filepath.Join(dir, "missing"), 10, "open " + filepath.Join(dir, "missing")},
		{good, 5, ""},
	} {
		done := make(chan error, 1)
		go func() {
			data, err := ReadRegular(tc.path, tc.limit)
			if err == nil && string(data) != "12345" {
				t.Errorf("%s: read %q", tc.path, data)
			}
			done <- err
		}()
		select {
		case err := <-done:
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("%s: %v, want %q", tc.path, err, tc.want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: still reading after 30 s", tc.path)
		}
	}
}
