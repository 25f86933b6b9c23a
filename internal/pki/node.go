package pki

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
)

// PEMPair is a PEM certificate and its PEM key, as the join API sends them;
// Pair says where they are on disk.
type PEMPair struct {
	Cert, Key []byte
}

// NodeCerts are the credentials of a node that joins the cluster, the same
// identities the server's own node has. The join API sends them as JSON
// with these field names.
type NodeCerts struct {
	KubeletClient  PEMPair // system:node:<name> in system:nodes
	KubeletServing PEMPair // the kubelet's serving certificate, of the kubelet CA
	Proxy          PEMPair // system:kube-proxy
	DNS            PEMPair // system:kelp-dns
	Controller     PEMPair // system:kelp-controller:<name> in system:kelp-controllers
}

// NodeFiles are where a node's credentials are on disk: NodeCerts and the
// certificates of the CAs that go with them.
type NodeFiles struct {
	ServerCA       string // verifies the apiserver
	ClientCA       string // verifies the kubelet's clients (the apiserver)
	KubeletClient  Pair
	KubeletServing Pair
	Proxy          Pair
	DNS            Pair
	Controller     Pair
}

// ControllerGroup is the group of every node's controllers (overlay,
// NetworkPolicy, local storage); RBAC grants it what they read and write.
const ControllerGroup = "system:kelp-controllers"

// SharedControllerUser is the identity every node's controllers shared
// before each node had its own; nodes not restarted since an upgrade still
// present it, and admission lets it write nothing.
const SharedControllerUser = "system:kelp-controller"

// ControllerUserPrefix starts the name of a node's controllers' identity;
// the node's name follows it. Admission limits each to its own node's
// objects by that name (package systemobjects).
const ControllerUserPrefix = "system:kelp-controller:"

// ControllerUser is the identity of the controllers of node, the common
// name of their certificate.
func ControllerUser(node string) string { return ControllerUserPrefix + strings.ToLower(node) }

// Node returns the files of the server's own node.
func (f Files) Node() NodeFiles {
	return NodeFiles{
		ServerCA:       f.ServerCA.Cert,
		ClientCA:       f.ClientCA.Cert,
		KubeletClient:  f.KubeletClient,
		KubeletServing: f.KubeletServing,
		Proxy:          f.KubeProxy,
		DNS:            f.DNS,
		Controller:     f.Controller,
	}
}

// filePEM is where a node's certificate and key go, and what they hold.
type filePEM struct {
	files Pair
	pem   PEMPair
}

// pairsOf pairs each of a node's credentials with its files in f.
func (f NodeFiles) pairsOf(certs NodeCerts) []filePEM {
	return []filePEM{
		{f.KubeletClient, certs.KubeletClient},
		{f.KubeletServing, certs.KubeletServing},
		{f.Proxy, certs.Proxy},
		{f.DNS, certs.DNS},
		{f.Controller, certs.Controller},
	}
}

// NodeFilesIn names the files of a node that joined in dir. They have the
// names the server gives its own node's, so a node's files are found by one
// rule whichever way it got them.
func NodeFilesIn(dir string) NodeFiles { return FilesIn(dir).Node() }

// Write saves a joined node's credentials and the CA certificates serverCA
// and clientCA in f. It writes nothing unless every one of them is there.
func (f NodeFiles) Write(serverCA, clientCA []byte, certs NodeCerts) error {
	files := map[string][]byte{f.ServerCA: serverCA, f.ClientCA: clientCA}
	for _, c := range f.pairsOf(certs) {
		files[c.files.Cert], files[c.files.Key] = c.pem.Cert, c.pem.Key
	}
	for path, data := range files {
		if len(data) == 0 {
			return fmt.Errorf("pki: no %s to write", filepath.Base(path))
		}
	}
	for path, data := range files {
		if err := ensurePrivateDir(filepath.Dir(path)); err != nil {
			return err
		}
		if err := writeFile(path, data); err != nil {
			return err
		}
	}
	return nil
}

// IssueNode signs new credentials for the node name with the addresses
// ips, with the CAs in f, as long-lived as the server's own leaves. It
// refuses addresses CheckKubeletSANs refuses (ErrKubeletSANs).
func IssueNode(f Files, name string, ips []net.IP) (NodeCerts, error) {
	if err := CheckKubeletSANs(f, name, ips, nil); err != nil {
		return NodeCerts{}, err
	}
	is := issuer{now: time.Now().UTC(), lifetime: f.leafLifetime(), log: logrus.WithField("component", "pki")}
	kubeletCA, err := loadAuthority(f.KubeletCA)
	if err != nil {
		return NodeCerts{}, err
	}
	clientCA, err := loadAuthority(f.ClientCA)
	if err != nil {
		return NodeCerts{}, err
	}
	name = strings.ToLower(name)
	var out NodeCerts
	for _, l := range []struct {
		spec leafSpec
		dst  *PEMPair
	}{
		{leafSpec{ca: clientCA, cn: "system:node:" + name, orgs: []string{"system:nodes"}, usages: clientAuth}, &out.KubeletClient},
		{leafSpec{ca: kubeletCA, cn: name, usages: serverAuth, sans: kubeletSANs(name, ips)}, &out.KubeletServing},
		{leafSpec{ca: clientCA, cn: "system:kube-proxy", usages: clientAuth}, &out.Proxy},
		{leafSpec{ca: clientCA, cn: "system:kelp-dns", usages: clientAuth}, &out.DNS},
		{leafSpec{ca: clientCA, cn: ControllerUser(name), orgs: []string{ControllerGroup}, usages: clientAuth}, &out.Controller},
	} {
		pair, err := is.issue(l.spec)
		if err != nil {
			return NodeCerts{}, err
		}
		*l.dst = pair
	}
	return out, nil
}

// loadAuthority reads a CA the server made before.
func loadAuthority(ca Pair) (*authority, error) {
	certPEM, err := readOptional(ca.Cert)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readOptional(ca.Key)
	if err != nil {
		return nil, err
	}
	if certPEM == nil || keyPEM == nil {
		return nil, fmt.Errorf("pki: CA %s or its key is missing", ca.Cert)
	}
	cert, chain, err := parseCAFile(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: CA %s: %w", ca.Cert, err)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key %s: %w", ca.Key, err)
	}
	return &authority{cert: cert, key: key, chain: chain}, nil
}
