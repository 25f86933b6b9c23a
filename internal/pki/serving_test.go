package pki

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestIssueServing(t *testing.T) {
	f, _ := run(t, testConfig(t))
	before, err := os.ReadDir(filepath.Dir(f.ServerCA.Cert))
	if err != nil {
		t.Fatal(err)
	}
	pair, err := IssueServing(f.ServerCA, "metrics-server", []string{"metrics-server.kube-system.svc", "10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := tls.X509KeyPair(pair.Cert, pair.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(kp.Certificate[0])
	caPEM, _ := os.ReadFile(f.ServerCA.Cert)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	for _, name := range []string{"metrics-server.kube-system.svc", "10.0.0.1"} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("does not verify as %s: %v", name, err)
		}
	}
	if !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Errorf("key usages %v, want server auth only", cert.ExtKeyUsage)
	}
	after, _ := os.ReadDir(filepath.Dir(f.ServerCA.Cert))
	if len(after) != len(before) {
		t.Errorf("%d files in the TLS directory after, %d before: nothing may be written", len(after), len(before))
	}

	if _, err := IssueServing(Pair{Cert: filepath.Join(t.TempDir(), "none.crt"), Key: filepath.Join(t.TempDir(), "none.key")}, "x", nil); err == nil {
		t.Error("a missing CA must be an error")
	}
}
