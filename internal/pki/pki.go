package pki

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
	// renewBefore is how long before expiry a leaf of leafValidity is
	// reissued, and a CA warned about. A running server or node renews its
	// leaves itself (package certrenew), but one that was stopped for
	// months, or cannot reach its server, still has room. Leaves of other
	// lifetimes are renewed in the same share of their life (renewAt).
	renewBefore = 120 * 24 * time.Hour
	// backdate tolerates clock skew between this node and the ones that
	// verify a freshly issued certificate.
	backdate = time.Hour
)

// Config describes the node the PKI is issued for.
type Config struct {
	Dir           string           // <data-dir>/server/tls
	Hostname      string           // node name / hostname
	IPs           []net.IP         // node IPs and advertise address
	ExtraSANs     []string         // --tls-san values
	ServiceIP     net.IP           // first IP of the service CIDR
	ClusterDomain string           // e.g. cluster.local
	Now           func() time.Time // nil = time.Now
	// LeafLifetime is how long new leaf certificates live; zero: a year.
	// Only tests shorten it (see package certrenew).
	LeafLifetime time.Duration
	// SharedDatastore says the cluster's servers share its datastore
	// (embedded etcd or an external one), so that there may be others: an
	// upgrade then cannot make a kubelet CA on one server alone (see
	// Ensure).
	SharedDatastore bool
}

// Validate reports the first setting Ensure cannot work with.
func (c Config) Validate() error {
	if c.Dir == "" {
		return errors.New("pki: TLS directory is empty")
	}
	if strings.TrimSpace(c.Hostname) == "" {
		return errors.New("pki: hostname is empty; set --node-name")
	}
	if c.LeafLifetime < 0 {
		return fmt.Errorf("pki: negative leaf lifetime %s", c.LeafLifetime)
	}
	if !validIP(c.ServiceIP) {
		return errors.New("pki: service IP is missing; check --service-cidr")
	}
	if strings.Trim(c.ClusterDomain, ". ") == "" {
		return errors.New("pki: cluster domain is empty; set --cluster-domain")
	}
	for _, ip := range c.IPs {
		if !validIP(ip) {
			return fmt.Errorf("pki: invalid node IP %q; check --node-ip and --advertise-address", ip)
		}
	}
	for _, san := range c.ExtraSANs {
		if !validSAN(san) {
			return fmt.Errorf("pki: --tls-san %q is neither an IP address nor a DNS name", san)
		}
	}
	return nil
}

// Pair is where a certificate and its private key are on disk; PEMPair
// holds their contents.
type Pair struct {
	Cert, Key string
}

// Files holds the absolute paths of everything Ensure manages. It is derived
// state: hand it to the components that need it, never write it back into a
// config.
type Files struct {
	// Certificate authorities.
	ServerCA        Pair // signs the apiserver's (and the metrics API's) serving certificates
	ClientCA        Pair // signs client certificates the apiserver accepts
	KubeletCA       Pair // signs the kubelets' serving certificates (see kubelet.go)
	RequestHeaderCA Pair // signs the aggregator's front-proxy client
	EtcdServerCA    Pair // signs etcd's serving and client certificates
	EtcdPeerCA      Pair // signs etcd's peer certificates
	// ServerCASigner, ClientCASigner and KubeletCASigner hold the
	// certificate of their CA alone, for the controller-manager's CSR
	// signers, which read exactly one certificate: during a CA rotation
	// the CA files are trust bundles of three.
	ServerCASigner, ClientCASigner, KubeletCASigner string
	// KubeletTrust is what the apiserver and kelp's metrics verify
	// kubelets with: KubeletCA's file, and for a while after an upgrade
	// the server CA (kubeletTrust).
	KubeletTrust string

	// Service-account token signing key pair.
	ServiceAccountKey, ServiceAccountPub string

	APIServer              Pair // serving, signed by ServerCA
	Admin                  Pair // system:admin
	ControllerManager      Pair
	Scheduler              Pair
	APIServerKubeletClient Pair // the apiserver's client to kubelets
	KubeletClient          Pair // system:node:<hostname>, the server's own node
	KubeletServing         Pair // signed by KubeletCA, which the apiserver verifies it with
	KubeProxy              Pair // system:kube-proxy, the node's Service proxy
	DNS                    Pair // system:kelp-dns, the node's DNS server
	Controller             Pair // system:kelp-controller:<hostname>, the node's overlay, NetworkPolicy and local storage
	AuthProxy              Pair // signed by RequestHeaderCA

	EtcdServer Pair // serving and client, signed by EtcdServerCA
	EtcdClient Pair // the apiserver's client to etcd
	EtcdPeer   Pair // signed by EtcdPeerCA
}

// FilesIn names the files Ensure keeps in dir, for code that reads them
// without running Ensure (kelp token, tests). The names follow k3s so that
// its operators find files where they expect.
func FilesIn(dir string) Files {
	pair := func(name string) Pair {
		return Pair{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
	}
	return Files{
		ServerCA:               pair("server-ca"),
		ClientCA:               pair("client-ca"),
		KubeletCA:              pair("kubelet-ca"),
		RequestHeaderCA:        pair("request-header-ca"),
		EtcdServerCA:           pair("etcd/server-ca"),
		EtcdPeerCA:             pair("etcd/peer-ca"),
		ServerCASigner:         filepath.Join(dir, "server-ca-signer.crt"),
		ClientCASigner:         filepath.Join(dir, "client-ca-signer.crt"),
		KubeletCASigner:        filepath.Join(dir, "kubelet-ca-signer.crt"),
		KubeletTrust:           filepath.Join(dir, "kubelet-trust.crt"),
		ServiceAccountKey:      filepath.Join(dir, "service.key"),
		ServiceAccountPub:      filepath.Join(dir, "service.pub"),
		APIServer:              pair("serving-kube-apiserver"),
		Admin:                  pair("client-admin"),
		ControllerManager:      pair("client-controller"),
		Scheduler:              pair("client-scheduler"),
		APIServerKubeletClient: pair("client-kube-apiserver"),
		KubeletClient:          pair("client-kubelet"),
		KubeletServing:         pair("serving-kubelet"),
		KubeProxy:              pair("client-kube-proxy"),
		DNS:                    pair("client-kelp-dns"),
		Controller:             pair("client-kelp-controller"),
		AuthProxy:              pair("client-auth-proxy"),
		EtcdServer:             pair("etcd/server-client"),
		EtcdClient:             pair("etcd/client"),
		EtcdPeer:               pair("etcd/peer-server-client"),
	}
}

func (f Files) all() []string {
	out := []string{f.ServiceAccountKey, f.ServiceAccountPub}
	for _, p := range append([]Pair{f.ServerCA, f.ClientCA, f.KubeletCA, f.RequestHeaderCA, f.EtcdServerCA, f.EtcdPeerCA}, f.Leaves()...) {
		out = append(out, p.Cert, p.Key)
	}
	return out
}

var (
	serverAuth       = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	clientAuth       = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	serverClientAuth = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
)

// Ensure creates whatever is missing under cfg.Dir and reissues leaf
// certificates that are close to expiry or no longer fit cfg. It is safe to
// call at every start: when nothing needs doing it writes nothing.
func Ensure(cfg Config) (Files, error) {
	return ensure(cfg, logrus.WithField("component", "pki"))
}

func ensure(cfg Config, log logrus.FieldLogger) (Files, error) {
	if err := cfg.Validate(); err != nil {
		return Files{}, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return Files{}, fmt.Errorf("pki: resolve %s: %w", cfg.Dir, err)
	}
	for _, d := range []string{dir, filepath.Join(dir, "etcd")} {
		if err := ensurePrivateDir(d); err != nil {
			return Files{}, err
		}
		// A crash while writing leaves temporary files; nothing else
		// writes here while the server starts.
		if err := atomicfile.RemoveTemps(d); err != nil {
			return Files{}, fmt.Errorf("pki: %w", err)
		}
	}
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	is := issuer{now: now().UTC(), lifetime: cfg.LeafLifetime, log: log}
	f := FilesIn(dir)
	if err := is.removeRetired(dir); err != nil {
		return Files{}, err
	}

	if cfg.SharedDatastore {
		// Each server would make a CA of its own, and verify only the
		// kubelets whose certificates it issued. The kubelet CA is the
		// server CA, as before there was one, on every server alike; the
		// names a node may ask for are limited all the same.
		copied, err := copyServerCA(f)
		if err != nil {
			return Files{}, err
		}
		if copied {
			log.Info("the kubelets' serving certificates stay signed by the server CA on this cluster, whose servers share its datastore: each would make a kubelet CA of its own; a node still gets no name or address of the apiserver's")
		}
	}
	newKubeletCA, err := kubeletCAMissing(f)
	if err != nil {
		return Files{}, err
	}
	var cas loadedCAs
	for _, ca := range cas.slots(f) {
		a, err := is.ensureCA(ca.name, ca.files)
		if err != nil {
			return Files{}, err
		}
		*ca.dst = a
	}
	if newKubeletCA {
		log.WithField("cert", f.KubeletCA.Cert).Info("made a CA for the kubelets' serving certificates, which the server CA signed before")
	}
	if bytes.Equal(cas.kubelet.cert.Raw, cas.server.cert.Raw) {
		// Said at every start: it stays so until the operator acts.
		log.Warn("the kubelets' serving certificates are signed by the server CA on this cluster (made before kelp had a kubelet CA, on a datastore its servers share), " +
			"so a client that trusts the apiserver trusts a kubelet's certificate too: `kelp certificate rotate-ca` gives the kubelets a CA of their own (README: Rotating the CAs)")
	}

	for path, ca := range map[string]*authority{f.ServerCASigner: cas.server, f.ClientCASigner: cas.client, f.KubeletCASigner: cas.kubelet} {
		if err := writeIfChanged(path, encodeCert(ca.cert.Raw)); err != nil {
			return Files{}, err
		}
	}
	if err := is.writeKubeletTrust(f, cas); err != nil {
		return Files{}, err
	}

	if err := is.ensureServiceAccountKey(f.ServiceAccountKey, f.ServiceAccountPub); err != nil {
		return Files{}, err
	}

	for _, l := range cfg.leaves(f, cas) {
		if _, err := is.ensureLeaf(l); err != nil {
			return Files{}, err
		}
	}

	// Files that existed before may carry a mode someone loosened by hand.
	for _, p := range f.all() {
		if err := is.tightenMode(p); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

// removeRetired removes files that earlier versions issued and nothing
// reads any more. client-kelp-supervisor was a system:masters credential:
// a cluster-admin key must not lie around unused.
func (is issuer) removeRetired(dir string) error {
	for _, name := range []string{"client-kelp-supervisor.crt", "client-kelp-supervisor.key"} {
		path := filepath.Join(dir, name)
		err := os.Remove(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("pki: remove unused %s: %w", path, err)
		}
		is.log.WithField("file", path).Info("removed a credential nothing uses")
	}
	return nil
}

// loadedCAs are the CAs leaves are signed with.
type loadedCAs struct {
	server, client, kubelet, requestHeader, etcdServer, etcdPeer *authority
}

// caSlot is one CA: its name, its files, and where it goes once loaded.
type caSlot struct {
	name  string
	files Pair
	dst   **authority
}

func (a *loadedCAs) slots(f Files) []caSlot {
	return []caSlot{
		{"kelp-server-ca", f.ServerCA, &a.server},
		{"kelp-client-ca", f.ClientCA, &a.client},
		{"kelp-kubelet-ca", f.KubeletCA, &a.kubelet},
		{"kelp-request-header-ca", f.RequestHeaderCA, &a.requestHeader},
		{"kelp-etcd-server-ca", f.EtcdServerCA, &a.etcdServer},
		{"kelp-etcd-peer-ca", f.EtcdPeerCA, &a.etcdPeer},
	}
}

// leaves are the leaf certificates of the server in c, signed by cas.
func (c Config) leaves(f Files, cas loadedCAs) []leafSpec {
	apiserverSANs := c.apiserverSANs()
	nodeSANs := c.nodeSANs()
	return []leafSpec{
		{ca: cas.server, files: f.APIServer, cn: "kube-apiserver", usages: serverAuth, sans: apiserverSANs},
		{ca: cas.client, files: f.Admin, cn: "system:admin", orgs: []string{"system:masters"}, usages: clientAuth},
		{ca: cas.client, files: f.ControllerManager, cn: "system:kube-controller-manager", usages: clientAuth},
		{ca: cas.client, files: f.Scheduler, cn: "system:kube-scheduler", usages: clientAuth},
		{ca: cas.client, files: f.APIServerKubeletClient, cn: "system:kube-apiserver", orgs: []string{"system:masters"}, usages: clientAuth},
		{ca: cas.client, files: f.KubeletClient, cn: "system:node:" + strings.ToLower(c.Hostname), orgs: []string{"system:nodes"}, usages: clientAuth},
		{ca: cas.kubelet, files: f.KubeletServing, cn: strings.ToLower(c.Hostname), usages: serverAuth, sans: kubeletSANs(c.Hostname, c.IPs)},
		{ca: cas.client, files: f.KubeProxy, cn: "system:kube-proxy", usages: clientAuth},
		{ca: cas.client, files: f.DNS, cn: "system:kelp-dns", usages: clientAuth},
		{ca: cas.client, files: f.Controller, cn: ControllerUser(c.Hostname), orgs: []string{ControllerGroup}, usages: clientAuth},
		{ca: cas.requestHeader, files: f.AuthProxy, cn: "system:auth-proxy", usages: clientAuth},
		{ca: cas.etcdServer, files: f.EtcdServer, cn: "etcd-server", usages: serverClientAuth, sans: nodeSANs},
		{ca: cas.etcdServer, files: f.EtcdClient, cn: "etcd-client", usages: clientAuth},
		{ca: cas.etcdPeer, files: f.EtcdPeer, cn: "etcd-peer", usages: serverClientAuth, sans: nodeSANs},
	}
}

// issuer carries what every step of one Ensure call shares.
type issuer struct {
	now      time.Time
	lifetime time.Duration // of the leaves it signs; zero: leafValidity
	log      logrus.FieldLogger
}

// leafLifetime is how long the leaves is signs live.
func (is issuer) leafLifetime() time.Duration {
	if is.lifetime > 0 {
		return is.lifetime
	}
	return leafValidity
}

func (is issuer) tightenMode(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if st.Mode().Perm() == fileMode {
		return nil
	}
	if err := os.Chmod(path, fileMode); err != nil {
		return fmt.Errorf("pki: restrict mode of %s: %w", path, err)
	}
	is.log.WithField("file", path).Warnf("changed mode from %04o to %04o", st.Mode().Perm(), fileMode)
	return nil
}

func (c Config) apiserverSANs() []string {
	sans := []string{
		c.Hostname, "localhost", "127.0.0.1", "::1",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc." + strings.Trim(c.ClusterDomain, ". "),
		c.ServiceIP.String(),
	}
	for _, ip := range c.IPs {
		sans = append(sans, ip.String())
	}
	return normalizeSANs(append(sans, c.ExtraSANs...))
}

// nodeSANs name this machine: etcd serves under them, to its local
// clients too.
func (c Config) nodeSANs() []string {
	sans := []string{c.Hostname, "localhost", "127.0.0.1", "::1"}
	for _, ip := range c.IPs {
		sans = append(sans, ip.String())
	}
	return normalizeSANs(sans)
}

func validIP(ip net.IP) bool { return len(ip) == net.IPv4len || len(ip) == net.IPv6len }

// validSAN accepts IP addresses and anything shaped like a (wildcard) DNS
// name, so that a typo in --tls-san fails loudly instead of landing in the
// certificate.
func validSAN(s string) bool {
	s = strings.TrimSpace(s)
	if net.ParseIP(s) != nil {
		return true
	}
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for i, label := range strings.Split(s, ".") {
		if label == "*" && i == 0 {
			continue
		}
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}
