package bootguard

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/version"
)

func TestUnstarted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the guard counts the starts of root's kelp only")
	}
	t.Setenv("KELP_CONFIG_FILE", filepath.Join(t.TempDir(), "none.yaml"))
	dataDir := t.TempDir()
	other := version.Ran{Kelp: "v0.0.1-other", Kubernetes: "v1.30.0"}
	if err := (Record{Ready: &other}).save(layout.BootGuard(dataDir)); err != nil {
		t.Fatal(err)
	}
	refused := errors.New("flag provided but not defined: -no-such-flag")
	starts := func() int {
		rec, err := load(layout.BootGuard(dataDir))
		if err != nil || rec.Upgrade == nil {
			return 0
		}
		return rec.Upgrade.Starts
	}
	args := func(extra ...string) []string {
		return append([]string{"kelp", "server", "--data-dir", dataDir, "--no-such-flag"}, extra...)
	}

	// Not a start of this node: left alone.
	for _, a := range [][]string{
		{"kelp", "snapshot", "ls", "--data-dir", dataDir},
		args("--cluster-reset"),
		{"kelp", "server", "--data-dir", filepath.Join(dataDir, "none")},
	} {
		if err := Unstarted(a, refused); err != refused || starts() != 0 {
			t.Errorf("Unstarted(%q) = %v, %d starts; want it left alone", a, err, starts())
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "none")); !os.IsNotExist(err) {
		t.Errorf("a data dir that did not exist: %v", err)
	}
	// A start of this kelp refused before it ran: counted, and the third
	// rolls back, which here finds no kelp.previous beside the test.
	for i := 1; i <= 3; i++ {
		err := Unstarted(args(), refused)
		if !errors.Is(err, refused) || !Counted(err) {
			t.Fatalf("start %d: %v", i, err)
		}
		if starts() != i {
			t.Errorf("after start %d the record has %d", i, starts())
		}
		if rolled := strings.Contains(err.Error(), "no previous kelp to go back to"); rolled != (i == 3) {
			t.Errorf("start %d: %v", i, err)
		}
	}
	// An error the guard counted already is not counted again.
	if err := Unstarted(args(), markCounted(refused)); !errors.Is(err, refused) || starts() != 3 {
		t.Errorf("a counted start counted again: %v, %d starts", err, starts())
	}
	// --upgrade-attempts 0 from the command line: counted, never rolled back.
	if err := Unstarted(args("--upgrade-attempts", "0"), refused); strings.Contains(err.Error(), "previous") || starts() != 4 {
		t.Errorf("with --upgrade-attempts 0: %v, %d starts", err, starts())
	}
}

func TestFlagValue(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		isBool bool
		want   string
	}{
		{[]string{"--data-dir", "/a"}, false, "/a"},
		{[]string{"-d", "/a", "--data-dir=/b"}, false, "/b"},
		{[]string{"-data-dir=/a", "--", "--data-dir", "/b"}, false, "/a"},
		{[]string{"--data-directory", "/a"}, false, ""},
		{[]string{"--cluster-reset"}, true, "true"},
		{[]string{"--cluster-reset=false"}, true, "false"},
		{[]string{"--cluster-reset-restore-path", "x"}, true, ""},
	} {
		if got := flagValue(tc.args, tc.isBool, "data-dir", "d", "cluster-reset"); got != tc.want {
			t.Errorf("flagValue(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}
