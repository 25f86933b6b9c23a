package pki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"slices"
	"testing"
)

func TestIssueNode(t *testing.T) {
	f, _ := run(t, testConfig(t))
	certs, err := IssueNode(f, "Agent-1", []net.IP{net.ParseIP("10.99.0.3")})
	if err != nil {
		t.Fatal(err)
	}
	caPool := func(path string) *x509.CertPool {
		pem, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		return pool
	}
	for _, tc := range []struct {
		name   string
		pair   KeyPair
		ca     string
		usage  x509.ExtKeyUsage
		cn     string
		groups []string
	}{
		{"kubelet client", certs.KubeletClient, f.ClientCA, x509.ExtKeyUsageClientAuth, "system:node:agent-1", []string{"system:nodes"}},
		{"kubelet serving", certs.KubeletServing, f.ServerCA, x509.ExtKeyUsageServerAuth, "agent-1", nil},
		{"proxy", certs.Proxy, f.ClientCA, x509.ExtKeyUsageClientAuth, "system:kube-proxy", nil},
		{"dns", certs.DNS, f.ClientCA, x509.ExtKeyUsageClientAuth, "system:kelp-dns", nil},
		{"controller", certs.Controller, f.ClientCA, x509.ExtKeyUsageClientAuth, "system:kelp-controller", nil},
	} {
		pair, err := tls.X509KeyPair(tc.pair.Cert, tc.pair.Key)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		cert, _ := x509.ParseCertificate(pair.Certificate[0])
		if _, err := cert.Verify(x509.VerifyOptions{Roots: caPool(tc.ca), KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
			t.Errorf("%s does not verify: %v", tc.name, err)
		}
		if cert.Subject.CommonName != tc.cn || !slices.Equal(cert.Subject.Organization, tc.groups) {
			t.Errorf("%s is %s in %v, want %s in %v", tc.name, cert.Subject.CommonName, cert.Subject.Organization, tc.cn, tc.groups)
		}
	}
	serving, _ := tls.X509KeyPair(certs.KubeletServing.Cert, certs.KubeletServing.Key)
	cert, _ := x509.ParseCertificate(serving.Certificate[0])
	if err := cert.VerifyHostname("10.99.0.3"); err != nil {
		t.Errorf("the serving certificate does not name the node's IP: %v", err)
	}
	if err := cert.VerifyHostname("agent-1"); err != nil {
		t.Errorf("the serving certificate does not name the node: %v", err)
	}
}
