package mirror

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/kelp-dev/kelp/internal/pki"
)

// Identity is how a node shows itself to the others: the certificate of
// its controllers (pki.ControllerUser, of the cluster's client CA) and the
// client CA's bundle, which vouches for the others' certificates. Both
// are read at every connection: they are renewed and rotated on disk while
// the node runs.
type Identity struct {
	Cert     pki.Pair
	ClientCA string
}

// ServerTLS serves the node's peers: a client must show a node's
// certificate of the cluster, or the handshake fails.
func (id Identity) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return id.load() },
		// Verified below, against the client CA as it is on disk now.
		ClientAuth: tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := id.verify(cs.PeerCertificates)
			return err
		},
	}
}

// ClientTLS reaches a peer: the node shows its certificate, and the peer
// must show the certificate of the node the connection was made for, whose
// name is the connection's server name (Mirror dials peers by node name).
// A node has no serving certificate other nodes trust (the kubelet's is of
// the kubelet CA, which nodes do not hold), so the peers verify each
// other's client certificates both ways, by the client CA and the node
// name, instead of a serving certificate by host name.
func (id Identity) ClientTLS() *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return id.load() },
		InsecureSkipVerify:   true, // VerifyConnection verifies instead.
		VerifyConnection: func(cs tls.ConnectionState) error {
			node, err := id.verify(cs.PeerCertificates)
			if err == nil && node != cs.ServerName {
				err = fmt.Errorf("the certificate is node %s's, not node %s's", node, cs.ServerName)
			}
			return err
		},
	}
}

func (id Identity) load() (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(id.Cert.Cert, id.Cert.Key)
	if err != nil {
		return nil, fmt.Errorf("mirror: load the node's certificate: %w", err)
	}
	return &cert, nil
}

// verify checks that certs are a node's, of the cluster's client CA, and
// returns its name.
func (id Identity) verify(certs []*x509.Certificate) (string, error) {
	if len(certs) == 0 {
		return "", errors.New("no certificate: only nodes of the cluster are served")
	}
	data, err := os.ReadFile(id.ClientCA)
	if err != nil {
		return "", fmt.Errorf("mirror: read the client CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(data) {
		return "", fmt.Errorf("mirror: no certificate in %s", id.ClientCA)
	}
	intermediates := x509.NewCertPool()
	for _, c := range certs[1:] {
		intermediates.AddCert(c)
	}
	leaf := certs[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return "", fmt.Errorf("not a certificate of the cluster: %w", err)
	}
	node, ok := NodeOf(leaf.Subject.CommonName, leaf.Subject.Organization)
	if !ok {
		return "", fmt.Errorf("%s is not a node: only nodes of the cluster are served", leaf.Subject.CommonName)
	}
	return node, nil
}

// NodeOf returns the node whose identity the common name cn in groups is:
// its kubelet's (system:node:<name> in system:nodes) or its controllers'.
func NodeOf(cn string, groups []string) (string, bool) {
	if name, ok := strings.CutPrefix(cn, "system:node:"); ok && name != "" && slices.Contains(groups, "system:nodes") {
		return name, true
	}
	if name, ok := strings.CutPrefix(cn, pki.ControllerUserPrefix); ok && name != "" && slices.Contains(groups, pki.ControllerGroup) {
		return name, true
	}
	return "", false
}
