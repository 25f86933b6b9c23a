package token

import (
	"net"
	"os"
	"testing"

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
