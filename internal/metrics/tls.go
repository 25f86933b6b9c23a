package metrics

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kelp-dev/kelp/internal/pki"
)

// apiTLSConfig is the API's: a serving certificate signed by the server
// CA, which the APIService's caBundle holds, for the name the aggregator
// checks (<service>.<namespace>.svc); and clients must show a certificate
// of the front-proxy CA.
func apiTLSConfig(cfg Config) (*tls.Config, error) {
	svc := Service + "." + Namespace + ".svc"
	serving := &servingCert{ca: cfg.Certs.ServerCA, sans: []string{svc, svc + "." + strings.Trim(cfg.ClusterDomain, ".")}}
	if _, err := serving.get(nil); err != nil {
		return nil, err
	}
	frontProxy, err := certPool(cfg.Certs.RequestHeaderCA.Cert)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		GetCertificate: serving.get,
		// Only the apiservers' aggregator holds a certificate of the
		// front-proxy CA, and it forwards a request only once the
		// apiserver has authenticated its user and authorized the
		// metrics.k8s.io request (RBAC): that is all the checking this API
		// needs. The user and groups it forwards in headers are not used.
		ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs:  frontProxy,
		MinVersion: tls.VersionTLS12,
	}, nil
}

// servingCert is signed in memory at start, and again once it is due for
// renewal: a server may run for longer than a certificate lives.
type servingCert struct {
	ca   pki.Pair
	sans []string

	mu      sync.Mutex
	cert    *tls.Certificate
	renewAt time.Time
}

func (s *servingCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert != nil && time.Now().Before(s.renewAt) {
		return s.cert, nil
	}
	cert, err := s.issue()
	if err != nil {
		if s.cert != nil {
			// Still valid for a third of its life.
			log.WithError(err).Warn("renew the metrics API's serving certificate")
			return s.cert, nil
		}
		return nil, err
	}
	s.cert = cert
	s.renewAt = cert.Leaf.NotAfter.Add(-pki.RenewalWindow(cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore)))
	return s.cert, nil
}

func (s *servingCert) issue() (*tls.Certificate, error) {
	pair, err := pki.IssueServing(s.ca, Service, s.sans)
	if err != nil {
		return nil, fmt.Errorf("metrics: serving certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(pair.Cert, pair.Key)
	if err != nil {
		return nil, fmt.Errorf("metrics: serving certificate: %w", err)
	}
	return &cert, nil
}

// kubeletTLSConfig reads kubelets as the apiserver does: with its kubelet
// client certificate, read at every connection because it is renewed on
// disk while the server runs, and trusting what the apiserver verifies
// kubelets with (the kubelet CA).
func kubeletTLSConfig(certs pki.Files) (*tls.Config, error) {
	ca, err := certPool(certs.KubeletTrust)
	if err != nil {
		return nil, err
	}
	client := certs.APIServerKubeletClient
	load := func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		cert, err := tls.LoadX509KeyPair(client.Cert, client.Key)
		if err != nil {
			return nil, fmt.Errorf("metrics: load the kubelet client certificate: %w", err)
		}
		return &cert, nil
	}
	if _, err := load(nil); err != nil {
		return nil, err
	}
	return &tls.Config{GetClientCertificate: load, RootCAs: ca, MinVersion: tls.VersionTLS12}, nil
}

func certPool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("metrics: no certificate in %s", path)
	}
	return pool, nil
}
