package pki

import (
	"bytes"
	"crypto/x509"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
)

// A node's serving certificate names the node and its addresses, and
// only the kubelet CA vouches for it: never the server CA, which every
// client of the apiserver trusts.
func TestIssueNodeServingCertificate(t *testing.T) {
	f, _ := run(t, testConfig(t))
	certs, err := IssueNode(f, "agent-1", []net.IP{net.ParseIP("10.99.0.3"), net.ParseIP("fd00::3")})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := parseCert(certs.KubeletServing.Cert)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := certSANs(leaf), []string{"10.99.0.3", "agent-1", "fd00::3"}; !slices.Equal(got, want) {
		t.Errorf("the serving certificate names %v, want %v", got, want)
	}
	if err := verify(t, certs.KubeletServing.Cert, loadCert(t, f.KubeletCA.Cert)); err != nil {
		t.Errorf("against the kubelet CA: %v", err)
	}
	if err := verify(t, certs.KubeletServing.Cert, loadCert(t, f.ServerCA.Cert)); err == nil {
		t.Error("the node's serving certificate verifies against the server CA")
	}
	// The server's own node's too.
	own := readFile(t, f.KubeletServing.Cert)
	if err := verify(t, own, loadCert(t, f.ServerCA.Cert)); err == nil {
		t.Error("the server's node's serving certificate verifies against the server CA")
	}
	if got, want := certSANs(loadCert(t, f.KubeletServing.Cert)), []string{"192.168.1.10", "fd00::10", "node-1"}; !slices.Equal(got, want) {
		t.Errorf("the server's node's serving certificate names %v, want %v", got, want)
	}
}

// A joining node asking for a name or address of the apiserver, loopback
// or a great many addresses gets nothing, and is told why.
func TestIssueNodeRefusesNamesNotTheNodes(t *testing.T) {
	f, _ := run(t, testConfig(t))
	var many []net.IP
	for i := range 200 {
		many = append(many, net.IPv4(10, 99, byte(i/250), byte(1+i%250)))
	}
	for _, tc := range []struct {
		name string
		node string
		ips  []net.IP
		want string
	}{
		{"the apiserver's service IP", "agent-1", []net.IP{net.ParseIP("10.43.0.1")}, "10.43.0.1 (an address of the apiserver)"},
		{"a server's address", "agent-1", []net.IP{net.ParseIP("192.168.1.10")}, "an address of the apiserver"},
		{"a --tls-san address", "agent-1", []net.IP{net.ParseIP("203.0.113.7")}, "an address of the apiserver"},
		{"127.0.0.1", "agent-1", []net.IP{net.ParseIP("127.0.0.1")}, "a loopback address"},
		{"::1", "agent-1", []net.IP{net.ParseIP("::1")}, "a loopback address"},
		{"0.0.0.0", "agent-1", []net.IP{net.IPv4zero}, "not a node's address"},
		{"localhost", "localhost", nil, "a loopback name"},
		{"kubernetes", "kubernetes", nil, "a name of the apiserver"},
		{"kubernetes.default", "kubernetes.default", nil, "a name of the apiserver"},
		{"kubernetes.default.svc", "kubernetes.default.svc", nil, "a name of the apiserver"},
		{"the cluster domain", "kubernetes.default.svc.cluster.local", nil, "a name of the apiserver"},
		{"another cluster domain", "kubernetes.default.svc.example", nil, "a name of the apiserver"},
		{"a --tls-san name", "kelp.example.com", nil, "a name of the apiserver"},
		{"the server's node name", "node-1", nil, "a name of the apiserver"},
		{"200 addresses", "agent-1", many, "asks for 201 names and addresses, at most 16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := IssueNode(f, tc.node, tc.ips)
			if !errors.Is(err, ErrKubeletSANs) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("IssueNode(%s, %v): %v, want %v naming %q", tc.node, tc.ips, err, ErrKubeletSANs, tc.want)
			}
		})
	}
	if _, err := IssueNode(f, "agent-1", many[:MaxKubeletSANs-1]); err != nil {
		t.Errorf("a node with %d addresses: %v", MaxKubeletSANs-1, err)
	}
}

// A cluster made with a kubelet CA verifies kubelets with it alone. One
// that gets it at an upgrade trusts the server CA for kubelets too, for
// as long as a serving certificate it gave a node before may be valid.
func TestKubeletTrust(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	if got, want := readFile(t, f.KubeletTrust), readFile(t, f.KubeletCA.Cert); !bytes.Equal(got, want) {
		t.Errorf("a new cluster's kubelet-trust.crt holds %q, want the kubelet CA alone", got)
	}

	// A server made before there was a kubelet CA: the server CA signed
	// the node's serving certificate, for localhost too.
	remove(t, f.KubeletCA.Cert)
	remove(t, f.KubeletCA.Key)
	serverCA, err := loadAuthority(f.ServerCA)
	if err != nil {
		t.Fatal(err)
	}
	is := issuer{now: t0, log: logrus.New()}
	old, err := is.issue(leafSpec{ca: serverCA, cn: "node-1", usages: serverAuth, sans: cfg.nodeSANs()})
	if err != nil {
		t.Fatal(err)
	}
	write(t, f.KubeletServing.Cert, old.Cert)
	write(t, f.KubeletServing.Key, old.Key)
	oldServing, serverPEM := old.Cert, readFile(t, f.ServerCA.Cert)

	// The upgrade, a month later, makes the kubelet CA, and the server's
	// own node's certificate moves to it.
	upgrade := t0.Add(30 * 24 * time.Hour)
	_, hook := run(t, at(cfg, upgrade))
	kubeletPEM := readFile(t, f.KubeletCA.Cert)
	trust := readFile(t, f.KubeletTrust)
	if want := append(slices.Clone(kubeletPEM), serverPEM...); !bytes.Equal(trust, want) {
		t.Errorf("after an upgrade kubelet-trust.crt holds %q, want the kubelet CA and the server CA", trust)
	}
	var said bool
	for _, e := range hook.AllEntries() {
		said = said || strings.Contains(e.Message, "made a CA for the kubelets' serving certificates")
	}
	if !said {
		t.Error("making the kubelet CA of an existing cluster was not logged")
	}
	if err := verify(t, readFile(t, f.KubeletServing.Cert), loadCert(t, f.KubeletCA.Cert)); err != nil {
		t.Errorf("the server's node's serving certificate after the upgrade: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(trust)
	for name, leaf := range map[string][]byte{"before": oldServing, "after": readFile(t, f.KubeletServing.Cert)} {
		c, _ := parseCert(leaf)
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: upgrade, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("a node's serving certificate from %s the upgrade against kubelet-trust.crt: %v", name, err)
		}
	}

	// kelp certificate check lists the CAs from their own files, not as
	// a CA that trusts another until rotate-ca --finish.
	statuses, err := Check(cfg.Dir, upgrade)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range statuses {
		if st.Path == f.KubeletTrust {
			t.Errorf("kelp certificate check lists %s: %+v", st.Path, st)
		}
	}

	// Once every certificate of before has expired, the server CA goes.
	later := upgrade.Add(leafValidity + time.Minute)
	run(t, at(cfg, later))
	if got := readFile(t, f.KubeletTrust); !bytes.Equal(got, kubeletPEM) {
		t.Errorf("a year after the upgrade kubelet-trust.crt holds %d certificates, want the kubelet CA alone", strings.Count(string(got), "BEGIN"))
	}
	// So it does at a CA rotation, which renews every node's certificates:
	// back to an hour after the upgrade, the server CA is trusted, and
	// after rotate-ca no more.
	run(t, at(cfg, upgrade.Add(time.Hour)))
	if _, err := RotateCA(cfg.Dir, "", upgrade.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	run(t, at(cfg, upgrade.Add(time.Hour)))
	if got, want := readFile(t, f.KubeletTrust), readFile(t, f.KubeletCA.Cert); !bytes.Equal(got, want) {
		t.Errorf("after rotate-ca kubelet-trust.crt holds %d certificates, want the kubelet CA file alone (%d)", strings.Count(string(got), "BEGIN"), strings.Count(string(want), "BEGIN"))
	}
}

// A cluster whose servers share its datastore keeps the server CA as its
// kubelet CA at the upgrade, the same on every server, and a node still
// gets none of the apiserver's names.
func TestKubeletCAOfSharedDatastoreUpgrade(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	remove(t, f.KubeletCA.Cert)
	remove(t, f.KubeletCA.Key)
	cfg.SharedDatastore = true
	run(t, cfg)
	for _, p := range [][2]string{{f.KubeletCA.Cert, f.ServerCA.Cert}, {f.KubeletCA.Key, f.ServerCA.Key}, {f.KubeletTrust, f.ServerCA.Cert}} {
		if !bytes.Equal(readFile(t, p[0]), readFile(t, p[1])) {
			t.Errorf("%s differs from %s", p[0], p[1])
		}
	}
	if err := verify(t, readFile(t, f.KubeletServing.Cert), loadCert(t, f.ServerCA.Cert)); err != nil {
		t.Errorf("the server's node's serving certificate: %v", err)
	}
	if _, err := IssueNode(f, "agent-1", []net.IP{cfg.ServiceIP}); err == nil {
		t.Error("a node got a serving certificate for the service IP")
	}
	// A copy cut short after the key is copied again.
	remove(t, f.KubeletCA.Cert)
	run(t, cfg)
	if !bytes.Equal(readFile(t, f.KubeletCA.Cert), readFile(t, f.ServerCA.Cert)) {
		t.Error("a copy cut short left a kubelet CA that is not the server CA")
	}
	// A cluster that has its kubelet CA keeps it, and says at every start
	// that it is the server CA, and what to do.
	kubeletPEM := readFile(t, f.KubeletCA.Cert)
	_, hook := run(t, cfg)
	if !bytes.Equal(readFile(t, f.KubeletCA.Cert), kubeletPEM) {
		t.Error("a second start changed the kubelet CA")
	}
	if !saysRotate(hook) {
		t.Error("a start of a cluster whose kubelet CA is its server CA did not say to rotate the CAs")
	}
	if _, hook := run(t, testConfig(t)); saysRotate(hook) {
		t.Error("a cluster with a kubelet CA of its own was told to rotate the CAs")
	}
}

func saysRotate(hook *logtest.Hook) bool {
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel && strings.Contains(e.Message, "kelp certificate rotate-ca") {
			return true
		}
	}
	return false
}
