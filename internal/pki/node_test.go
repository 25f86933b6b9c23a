package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
		pair   PEMPair
		ca     string
		usage  x509.ExtKeyUsage
		cn     string
		groups []string
	}{
		{"kubelet client", certs.KubeletClient, f.ClientCA.Cert, x509.ExtKeyUsageClientAuth, "system:node:agent-1", []string{"system:nodes"}},
		{"kubelet serving", certs.KubeletServing, f.KubeletCA.Cert, x509.ExtKeyUsageServerAuth, "agent-1", nil},
		{"proxy", certs.Proxy, f.ClientCA.Cert, x509.ExtKeyUsageClientAuth, "system:kube-proxy", nil},
		{"dns", certs.DNS, f.ClientCA.Cert, x509.ExtKeyUsageClientAuth, "system:kelp-dns", nil},
		{"controller", certs.Controller, f.ClientCA.Cert, x509.ExtKeyUsageClientAuth, "system:kelp-controller:agent-1", []string{"system:kelp-controllers"}},
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

// A joined node keeps its files under these names across upgrades: the
// server CA among them is the one pinned at its first join.
func TestNodeFilesIn(t *testing.T) {
	pair := func(name string) Pair { return Pair{Cert: "/tls/" + name + ".crt", Key: "/tls/" + name + ".key"} }
	want := NodeFiles{
		ServerCA:       "/tls/server-ca.crt",
		ClientCA:       "/tls/client-ca.crt",
		KubeletClient:  pair("client-kubelet"),
		KubeletServing: pair("serving-kubelet"),
		Proxy:          pair("client-kube-proxy"),
		DNS:            pair("client-kelp-dns"),
		Controller:     pair("client-kelp-controller"),
	}
	if got := NodeFilesIn("/tls"); got != want {
		t.Errorf("NodeFilesIn = %+v, want %+v", got, want)
	}
}

func TestNodeFilesWrite(t *testing.T) {
	pem := func(s string) PEMPair { return PEMPair{Cert: []byte(s + " cert"), Key: []byte(s + " key")} }
	certs := NodeCerts{KubeletClient: pem("kubelet"), KubeletServing: pem("serving"), Proxy: pem("proxy"), DNS: pem("dns"), Controller: pem("controller")}
	f := NodeFilesIn(filepath.Join(t.TempDir(), "agent", "tls"))
	if err := f.Write([]byte("server ca"), []byte("client ca"), certs); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		f.ServerCA: "server ca", f.ClientCA: "client ca",
		f.KubeletClient.Cert: "kubelet cert", f.KubeletClient.Key: "kubelet key",
		f.KubeletServing.Cert: "serving cert", f.KubeletServing.Key: "serving key",
		f.Proxy.Cert: "proxy cert", f.Proxy.Key: "proxy key",
		f.DNS.Cert: "dns cert", f.DNS.Key: "dns key",
		f.Controller.Cert: "controller cert", f.Controller.Key: "controller key",
	} {
		data, err := os.ReadFile(path)
		if err != nil || string(data) != want {
			t.Errorf("%s holds %q (%v), want %q", path, data, err, want)
		}
		if st, err := os.Stat(path); err == nil && st.Mode().Perm() != fileMode {
			t.Errorf("%s: mode %04o, want %04o", path, st.Mode().Perm(), fileMode)
		}
	}

	// An answer missing a key writes nothing, so the files on disk stay
	// one consistent set.
	certs.DNS.Key = nil
	g := NodeFilesIn(filepath.Join(t.TempDir(), "tls"))
	err := g.Write([]byte("server ca"), []byte("client ca"), certs)
	if err == nil || !strings.Contains(err.Error(), "client-kelp-dns.key") {
		t.Errorf("Write with a missing key: %v, want an error naming client-kelp-dns.key", err)
	}
	if _, err := os.Stat(g.ServerCA); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Write with a missing key wrote %s (%v)", g.ServerCA, err)
	}
}
