package killall

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/layout"
)

// TestCommandDataDir: kelp killall stops the node of --data-dir, else of
// KELP_DATA_DIR, else of data-dir in the config file (--config, else
// KELP_CONFIG_FILE, else /etc/kelp/config.yaml), else of /var/lib/kelp.
// Before it took --config, it ignored the config file, and
// kelp-uninstall.sh stopped the node of /var/lib/kelp instead.
func TestCommandDataDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	// The server's config has keys killall has no flag for.
	if err := os.WriteFile(file, []byte("data-dir: /srv/file\ncluster-init: true\nnode-name: n1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("data-dir: /srv/x\ndata-dir: /srv/y\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		want    string
		wantErr string
	}{
		{"flag", map[string]string{"KELP_DATA_DIR": "/srv/env", "KELP_CONFIG_FILE": file}, []string{"--data-dir", "/srv/flag"}, "/srv/flag", ""},
		{"relative flag", map[string]string{"KELP_CONFIG_FILE": empty}, []string{"-d", "kelp"}, "", ""},
		{"environment", map[string]string{"KELP_DATA_DIR": "/srv/env", "KELP_CONFIG_FILE": file}, nil, "/srv/env", ""},
		{"config file in the environment", map[string]string{"KELP_CONFIG_FILE": file}, nil, "/srv/file", ""},
		{"config file by flag", map[string]string{"KELP_CONFIG_FILE": empty}, []string{"-c", file}, "/srv/file", ""},
		{"default", map[string]string{"KELP_CONFIG_FILE": empty}, nil, layout.DefaultDataDir, ""},
		{"bad config file", map[string]string{"KELP_CONFIG_FILE": bad}, nil, "", "config file " + bad + " line 2: key \"data-dir\" is repeated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"KELP_DATA_DIR", "KELP_CONFIG_FILE"} {
				t.Setenv(k, "")
				os.Unsetenv(k)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var got string
			app := &cli.App{Name: "kelp", Commands: []*cli.Command{command(func(dataDir string) error { got = dataDir; return nil })}}
			full, err := config.WithFileArgs(app, append([]string{"kelp", "killall"}, tc.args...))
			if err == nil {
				err = app.Run(full)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("got %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			want := tc.want
			if want == "" {
				cwd, _ := os.Getwd()
				want = filepath.Join(cwd, "kelp")
			}
			if err != nil || got != want {
				t.Errorf("data dir %q, %v; want %q", got, err, want)
			}
		})
	}
}
