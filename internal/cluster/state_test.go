package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadRefusesStatesOthersWrote: Delete and Start kill what a state
// names, so a state file another user could have written is refused.
func TestLoadRefusesStatesOthersWrote(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files to another user")
	}
	for _, tc := range []struct {
		name  string
		spoil func(dir string) error
		want  string // in the error; "" for none
	}{
		{"the caller's", func(string) error { return nil }, ""},
		{"a directory others write to", func(dir string) error { return os.Chmod(dir, 0o777) }, "writable by other users"},
		{"a file others write to", func(dir string) error { return os.Chmod(filepath.Join(dir, stateFile), 0o666) }, "writable by other users"},
		{"another user's file", func(dir string) error { return os.Chown(filepath.Join(dir, stateFile), 65534, 65534) }, "belongs to uid 65534"},
		{"another user's directory", func(dir string) error { return os.Chown(dir, 65534, 65534) }, "belongs to uid 65534"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "demo")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			// A forwarder pid of 1: what a forged state would kill.
			state := `{"name":"demo","running":true,"forwarder":{"pid":1,"start":1}}`
			if err := os.WriteFile(filepath.Join(dir, stateFile), []byte(state), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := tc.spoil(dir); err != nil {
				t.Fatal(err)
			}
			s, err := load(dir)
			if tc.want == "" {
				if err != nil || s.Name != "demo" {
					t.Errorf("load = %v, %v; want the state", s, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("load = %v; want an error saying %q", err, tc.want)
			}
		})
	}
}
