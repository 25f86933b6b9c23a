package addons

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func TestRetrier(t *testing.T) {
	now := time.Now()
	r := newRetrier()
	defer r.timer.Stop()
	r.now = func() time.Time { return now }
	armed := func() bool {
		// Stop reports whether the timer was armed; re-arm it as found.
		if r.timer.Stop() {
			r.timer.Reset(time.Hour)
			return true
		}
		return false
	}

	r.schedule(false)
	if armed() {
		t.Error("armed after a pass with nothing to retry")
	}
	r.schedule(true)
	if !armed() || !r.first.Equal(now) {
		t.Errorf("not armed after the first pass to retry (first %s)", r.first)
	}
	now = now.Add(retryFor - time.Second)
	r.schedule(true)
	if !armed() {
		t.Error("not armed within the quick retries")
	}
	now = now.Add(2 * time.Second)
	r.schedule(true)
	if armed() {
		t.Error("armed after the quick retries ran out: the resync's turn")
	}
	// A change to the directory brings new quick retries.
	r.restart()
	r.schedule(true)
	if !armed() || !r.first.Equal(now) {
		t.Error("no quick retries after a change")
	}
	r.schedule(false)
	if armed() || !r.first.IsZero() {
		t.Error("still armed after a pass with nothing left to retry")
	}
}

func TestReadDir(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"a.yaml", "b.yml", "c.json", "d.yaml", "d.yaml.skip", "e.txt", ".a.yaml.tmp-1", "gone.yaml.skip"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "e.txt"), filepath.Join(dir, "linked.yaml")); err != nil {
		t.Fatal(err)
	}
	c := &Controller{dir: dir}
	files, skipped, err := c.readDir()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a.yaml", "b.yml", "c.json", "linked.yaml"}; !reflect.DeepEqual(files, want) {
		t.Errorf("manifests %v, want %v", files, want)
	}
	if want := map[string]bool{"d.yaml": true, "gone.yaml": true}; !reflect.DeepEqual(skipped, want) {
		t.Errorf("skipped %v, want %v", skipped, want)
	}
}
