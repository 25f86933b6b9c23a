package kubeconfig

import (
	"os"
	"path/filepath"
	"reflect"
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

// A client made from the kubeconfig reads the certificate from its files,
// which is what makes client-go reload it.
func TestWriteLocal(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.Mkdir("tls", 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tls/ca.crt", "tls/c.crt", "tls/c.key"} {
		if err := os.WriteFile(name, []byte("PEM of "+name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "cred", "admin.kubeconfig")
	if err := WriteLocal(path, Client{Server: "https://127.0.0.1:6443", CAFile: "tls/ca.crt", Cert: pki.Pair{Cert: "tls/c.crt", Key: "tls/c.key"}}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v", path, st, err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	tls := rc.TLSClientConfig
	if rc.Host != "https://127.0.0.1:6443" || tls.CAFile != filepath.Join(dir, "tls/ca.crt") ||
		tls.CertFile != filepath.Join(dir, "tls/c.crt") || tls.KeyFile != filepath.Join(dir, "tls/c.key") ||
		len(tls.CAData)+len(tls.CertData)+len(tls.KeyData) != 0 {
		t.Errorf("client config %s %+v, want absolute files and no data", rc.Host, tls)
	}
}

// A client made in the process talks to the server as one made from the
// file WriteLocal wrote.
func TestRESTConfigIsWriteLocal(t *testing.T) {
	dir := t.TempDir()
	c := Client{Server: "https://127.0.0.1:6443", CAFile: filepath.Join(dir, "ca.crt"),
		Cert: pki.Pair{Cert: filepath.Join(dir, "c.crt"), Key: filepath.Join(dir, "c.key")}}
	for _, name := range []string{"ca.crt", "c.crt", "c.key"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("data of "+name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "admin.kubeconfig")
	if err := WriteLocal(path, c); err != nil {
		t.Fatal(err)
	}
	fromFile, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	inProcess, err := c.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(inProcess, fromFile) {
		t.Errorf("RESTConfig: %+v, the file's: %+v", inProcess, fromFile)
	}
}
