package kubeconfig

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/pki"
)

// Client names a client certificate and the server it talks to.
type Client struct {
	Server string // https://127.0.0.1:6443
	CAFile string
	Cert   pki.Pair
}

// Write writes a kubeconfig for c to path with the given mode, embedding the
// certificates so the file can be copied to another machine. It replaces
// the file atomically and creates the parent directory if needed.
func Write(path string, mode os.FileMode, c Client) error {
	ca, err := os.ReadFile(c.CAFile)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	cert, err := os.ReadFile(c.Cert.Cert)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	key, err := os.ReadFile(c.Cert.Key)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["default"] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthorityData: ca}
	cfg.AuthInfos["default"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "default", AuthInfo: "default"}
	cfg.CurrentContext = "default"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return atomicfile.Write(path, data, mode)
}

// WriteLocal writes a kubeconfig for c to path, for a client on this
// machine: it names the certificate files instead of embedding them, so
// that the client follows its certificate when it is renewed (client-go
// reloads only certificates it was given by file).
func WriteLocal(path string, c Client) error {
	c, err := c.absolute()
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["default"] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthority: c.CAFile}
	cfg.AuthInfos["default"] = &clientcmdapi.AuthInfo{ClientCertificate: c.Cert.Cert, ClientKey: c.Cert.Key}
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "default", AuthInfo: "default"}
	cfg.CurrentContext = "default"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return atomicfile.Write(path, data, 0o600)
}

// RESTConfig is the client configuration of the kubeconfig WriteLocal
// writes, for a client in this process: made without the file, so that a
// process makes it once and before the apiserver answers.
func (c Client) RESTConfig() (*rest.Config, error) {
	c, err := c.absolute()
	if err != nil {
		return nil, err
	}
	return &rest.Config{
		Host:            c.Server,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.CAFile, CertFile: c.Cert.Cert, KeyFile: c.Cert.Key},
	}, nil
}

// absolute is c with absolute file names: a client may run in another
// directory than the one that named them.
func (c Client) absolute() (Client, error) {
	for _, f := range []*string{&c.CAFile, &c.Cert.Cert, &c.Cert.Key} {
		abs, err := filepath.Abs(*f)
		if err != nil {
			return Client{}, err
		}
		*f = abs
	}
	return c, nil
}
