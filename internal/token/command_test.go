package token

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

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
