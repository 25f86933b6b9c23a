package pki

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
)

// KeyPair is a PEM certificate and its PEM key.
type KeyPair struct {
	Cert, Key []byte
}

// NodeCerts are the credentials of a node that joins the cluster, the same
// identities the server's own node has.
type NodeCerts struct {
	KubeletClient  KeyPair // system:node:<name> in system:nodes
	KubeletServing KeyPair // the kubelet's serving certificate
	Proxy          KeyPair // system:kube-proxy
	DNS            KeyPair // system:kelp-dns
	Controller     KeyPair // system:kelp-controller
}

// IssueNode signs new credentials for the node name with the addresses
// ips, with the CAs in f.
func IssueNode(f Files, name string, ips []net.IP) (NodeCerts, error) {
	is := issuer{now: time.Now().UTC(), log: logrus.WithField("component", "pki")}
	serverCA, err := loadAuthority(f.ServerCA, f.ServerCAKey)
	if err != nil {
		return NodeCerts{}, err
	}
	clientCA, err := loadAuthority(f.ClientCA, f.ClientCAKey)
	if err != nil {
		return NodeCerts{}, err
	}
	name = strings.ToLower(name)
	sans := []string{name, "localhost", "127.0.0.1", "::1"}
	for _, ip := range ips {
		sans = append(sans, ip.String())
	}
	var out NodeCerts
	for _, l := range []struct {
		spec leafSpec
		dst  *KeyPair
	}{
		{leafSpec{ca: clientCA, cn: "system:node:" + name, orgs: []string{"system:nodes"}, usages: clientAuth}, &out.KubeletClient},
		{leafSpec{ca: serverCA, cn: name, usages: serverAuth, sans: normalizeSANs(sans)}, &out.KubeletServing},
		{leafSpec{ca: clientCA, cn: "system:kube-proxy", usages: clientAuth}, &out.Proxy},
		{leafSpec{ca: clientCA, cn: "system:kelp-dns", usages: clientAuth}, &out.DNS},
		{leafSpec{ca: clientCA, cn: "system:kelp-controller", usages: clientAuth}, &out.Controller},
	} {
		l.spec.cert = l.spec.cn // names the certificate in errors
		key, err := newKey()
		if err != nil {
			return NodeCerts{}, err
		}
		der, err := is.sign(l.spec, key)
		if err != nil {
			return NodeCerts{}, err
		}
		keyPEM, err := encodeKey(key)
		if err != nil {
			return NodeCerts{}, err
		}
		*l.dst = KeyPair{Cert: encodeCert(der), Key: keyPEM}
	}
	return out, nil
}

// loadAuthority reads a CA the server made before.
func loadAuthority(certPath, keyPath string) (*authority, error) {
	certPEM, err := readOptional(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readOptional(keyPath)
	if err != nil {
		return nil, err
	}
	if certPEM == nil || keyPEM == nil {
		return nil, fmt.Errorf("pki: CA %s or its key is missing", certPath)
	}
	cert, err := parseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: CA %s: %w", certPath, err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key %s: %w", keyPath, err)
	}
	return &authority{cert: cert, key: key}, nil
}
