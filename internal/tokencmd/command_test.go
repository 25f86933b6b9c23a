package tokencmd

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
)

// kelp token pins tokens to the CA of the server in --data-dir.
func TestCAHashReadsTheServersCA(t *testing.T) {
	dataDir := t.TempDir()
	certs, err := pki.Ensure(pki.Config{Dir: layout.Server(dataDir).TLS, Hostname: "server", ServiceIP: net.IPv4(10, 43, 0, 1).To4(), ClusterDomain: "cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(certs.ServerCA.Cert)
	if err != nil {
		t.Fatal(err)
	}
	got, err := caHash(dataDir)
	if err != nil || got != pki.CAHash(ca) {
		t.Errorf("caHash = %q, %v; want %q", got, err, pki.CAHash(ca))
	}
	if _, err := caHash(t.TempDir()); err == nil {
		t.Error("caHash of a data dir without a server: no error")
	}
}

// kelp token rotate --new-token takes a secret of 16 characters or more.
func TestRotateShortSecret(t *testing.T) {
	dataDir := t.TempDir()
	if _, err := pki.Ensure(pki.Config{Dir: layout.Server(dataDir).TLS, Hostname: "server", ServiceIP: net.IPv4(10, 43, 0, 1).To4(), ClusterDomain: "cluster.local"}); err != nil {
		t.Fatal(err)
	}
	rotate := func(secret string) error {
		app := &cli.App{Name: "kelp", Commands: []*cli.Command{Command()}, Writer: io.Discard, ErrWriter: io.Discard}
		return app.Run([]string{"kelp", "token", "rotate", "--data-dir", dataDir, "--new-token", secret})
	}
	if err := rotate("s3cret"); err == nil || !strings.Contains(err.Error(), "--new-token: a secret of 6 characters is too easy to guess") {
		t.Errorf("a short secret: %v", err)
	}
	if _, err := os.Stat(layout.Server(dataDir).Token); !os.IsNotExist(err) {
		t.Errorf("a short secret was written: %v", err)
	}
	if err := rotate("0123456789abcdef"); err != nil {
		t.Errorf("a secret of 16 characters: %v", err)
	}
}

// TestRotateFromFile: the new secret comes from a file, out of ps.
func TestRotateFromFile(t *testing.T) {
	dataDir := t.TempDir()
	if _, err := pki.Ensure(pki.Config{Dir: layout.Server(dataDir).TLS, Hostname: "server", ServiceIP: net.IPv4(10, 43, 0, 1).To4(), ClusterDomain: "cluster.local"}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "new-token")
	if err := os.WriteFile(file, []byte("0123456789abcdef-from-a-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	app := &cli.App{Name: "kelp", Commands: []*cli.Command{Command()}, Writer: io.Discard, ErrWriter: io.Discard}
	if err := app.Run([]string{"kelp", "token", "rotate", "--data-dir", dataDir, "--new-token-file", file}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(layout.Server(dataDir).Token)
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(data)), "::server:0123456789abcdef-from-a-file") {
		t.Errorf("token file %q, %v", data, err)
	}
	if err := app.Run([]string{"kelp", "token", "rotate", "--data-dir", dataDir, "--new-token-file", file, "--new-token", "0123456789abcdef"}); err == nil || !strings.Contains(err.Error(), "exclude each other") {
		t.Errorf("both: %v", err)
	}
}

// serverDataDir is a data dir with a server's CAs.
func serverDataDir(t *testing.T) string {
	t.Helper()
	dataDir := t.TempDir()
	if _, err := pki.Ensure(pki.Config{Dir: layout.Server(dataDir).TLS, Hostname: "server", ServiceIP: net.IPv4(10, 43, 0, 1).To4(), ClusterDomain: "cluster.local"}); err != nil {
		t.Fatal(err)
	}
	return dataDir
}

// runKelp runs kelp token as main does: the config files first.
func runKelp(args ...string) error {
	app := &cli.App{Name: "kelp", Commands: []*cli.Command{Command()}, Writer: io.Discard, ErrWriter: io.Discard}
	full, err := config.WithFileArgs(app, append([]string{"kelp", "token"}, args...))
	if err != nil {
		return err
	}
	return app.Run(full)
}

// TestDataDirPrecedence: kelp token acts on the server of --data-dir, else
// of KELP_DATA_DIR, else of data-dir in the config file (--config, else
// KELP_CONFIG_FILE, else /etc/kelp/config.yaml), else of /var/lib/kelp.
// Before kelp token took --config, it ignored the config file.
func TestDataDirPrecedence(t *testing.T) {
	flagDir, envDir, fileDir := serverDataDir(t), serverDataDir(t), serverDataDir(t)
	// The server's config has keys kelp token has no flag for.
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte("data-dir: "+fileDir+"\ncluster-init: true\ntoken: 0123456789abcdef-server\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unset := func(key string) { t.Setenv(key, ""); os.Unsetenv(key) }
	rotated := func(dir string) bool {
		t.Helper()
		_, err := os.Stat(layout.Server(dir).Token)
		if err == nil {
			if err := os.Remove(layout.Server(dir).Token); err != nil {
				t.Fatal(err)
			}
		}
		return err == nil
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"flag", map[string]string{"KELP_DATA_DIR": envDir, "KELP_CONFIG_FILE": file}, []string{"--data-dir", flagDir}, flagDir},
		{"short flag", map[string]string{"KELP_DATA_DIR": envDir, "KELP_CONFIG_FILE": file}, []string{"-d", flagDir}, flagDir},
		{"environment", map[string]string{"KELP_DATA_DIR": envDir, "KELP_CONFIG_FILE": file}, nil, envDir},
		{"config file in the environment", map[string]string{"KELP_CONFIG_FILE": file}, nil, fileDir},
		{"config file by flag", nil, []string{"--config", file}, fileDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unset("KELP_DATA_DIR")
			unset("KELP_CONFIG_FILE")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if err := runKelp(append([]string{"rotate", "--new-token", "0123456789abcdef"}, tc.args...)...); err != nil {
				t.Fatal(err)
			}
			for _, dir := range []string{flagDir, envDir, fileDir} {
				if got := rotated(dir); got != (dir == tc.want) {
					t.Errorf("token of %s rotated: %v, want %v", dir, got, dir == tc.want)
				}
			}
		})
	}
	t.Run("default", func(t *testing.T) {
		unset("KELP_DATA_DIR")
		t.Setenv("KELP_CONFIG_FILE", filepath.Join(t.TempDir(), "empty.yaml"))
		if err := os.WriteFile(os.Getenv("KELP_CONFIG_FILE"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		ca := pki.FilesIn(layout.Server(layout.DefaultDataDir).TLS).ServerCA.Cert
		if _, err := os.Stat(ca); err == nil {
			t.Skipf("%s exists: this machine is a kelp server", ca)
		}
		if err := runKelp("list"); err == nil || !strings.Contains(err.Error(), ca) {
			t.Errorf("kelp token list without a data dir: %v, want an error about %s", err, ca)
		}
	})
	t.Run("malformed config file", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad.yaml")
		if err := os.WriteFile(bad, []byte("data-dir: [oops\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := runKelp("list", "--config", bad); err == nil || !strings.Contains(err.Error(), "config file "+bad+" is not valid YAML") {
			t.Errorf("malformed config file: %v", err)
		}
	})
}
