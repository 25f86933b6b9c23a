package kubeconfig

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kelp-dev/kelp/internal/pki"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"ca.crt", "c.crt", "c.key"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("data of "+name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := Client{Server: "https://127.0.0.1:6443", CAFile: filepath.Join(dir, "ca.crt"),
		Cert: pki.Pair{Cert: filepath.Join(dir, "c.crt"), Key: filepath.Join(dir, "c.key")}}
	path := filepath.Join(dir, "etc", "kelp.yaml")
	for _, mode := range []os.FileMode{0o600, 0o644} {
		if err := Write(path, mode, c); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("mode %v, want %v", st.Mode().Perm(), mode)
		}
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cl := cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster]
	if cl.Server != c.Server || string(cl.CertificateAuthorityData) != "data of ca.crt" {
		t.Errorf("cluster %+v", cl)
	}
	if u := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]; string(u.ClientCertificateData) != "data of c.crt" || string(u.ClientKeyData) != "data of c.key" {
		t.Errorf("user %+v", u)
	}
	if err := Write(path, 0o600, Client{CAFile: filepath.Join(dir, "missing")}); err == nil {
		t.Error("a missing certificate must be an error")
	}
}
