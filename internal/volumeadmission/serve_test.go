package volumeadmission

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/kelp-dev/kelp/internal/pki"
)

// The webhook serves the apiserver's serving certificate, verified by the
// server CA for 127.0.0.1 as the apiserver calls it, and follows it when
// it is issued again while the server runs.
func TestServeFollowsTheRenewedCertificate(t *testing.T) {
	cfg := pki.Config{Dir: t.TempDir(), Hostname: "s1", ClusterDomain: "cluster.local", ServiceIP: net.ParseIP("10.43.0.1")}
	files, err := pki.Ensure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	run, err := serve(Config{Client: fake.NewClientset(), Serving: files.APIServer}, ln)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	ca, err := os.ReadFile(files.ServerCA.Cert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	served := func() *x509.Certificate {
		t.Helper()
		// As the apiserver dials https://127.0.0.1: no SNI, verified for the IP.
		conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0]
	}
	if got := served(); !slices.Contains(got.DNSNames, "s1") {
		t.Fatalf("served a certificate for %v, want the apiserver's", got.DNSNames)
	}

	cfg.ExtraSANs = []string{"renewed.example"}
	if _, err := pki.Ensure(cfg); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for !slices.Contains(served().DNSNames, "renewed.example") {
		if time.Now().After(deadline) {
			t.Fatal("the webhook still serves the certificate issued before")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
