package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func testConfig(t *testing.T) Config {
	t.Helper()
	return Config{
		Dir:           filepath.Join(t.TempDir(), "server", "tls"),
		Hostname:      "node-1",
		IPs:           []net.IP{net.ParseIP("192.168.1.10"), net.ParseIP("fd00::10")},
		ExtraSANs:     []string{"203.0.113.7", "kelp.example.com"},
		ServiceIP:     net.ParseIP("10.43.0.1"),
		ClusterDomain: "cluster.local",
		Now:           func() time.Time { return t0 },
	}
}

func at(cfg Config, when time.Time) Config {
	cfg.Now = func() time.Time { return when }
	return cfg
}

// run calls Ensure with a private logger so that tests can see what it logs.
func run(t *testing.T, cfg Config) (Files, *logtest.Hook) {
	t.Helper()
	logger, hook := logtest.NewNullLogger()
	f, err := ensure(cfg, logger.WithField("component", "pki"))
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	return f, hook
}

type fileState struct {
	data  []byte
	mtime time.Time
}

func snapshot(t *testing.T, f Files) map[string]fileState {
	t.Helper()
	s := map[string]fileState{}
	for _, p := range f.all() {
		st, err := os.Stat(p)
		if os.IsNotExist(err) {
			continue // a missing file compares unequal to any written one
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		s[p] = fileState{data: data, mtime: st.ModTime()}
	}
	return s
}

// changed lists the files whose bytes or mtime differ between two snapshots.
func changed(before, after map[string]fileState) []string {
	var out []string
	for p, b := range before {
		a, ok := after[p]
		if !ok || !bytes.Equal(a.data, b.data) || !a.mtime.Equal(b.mtime) {
			out = append(out, p)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

func sorted(paths ...string) []string {
	out := slices.Clone(paths)
	slices.Sort(out)
	return out
}

func infoEntries(hook *logtest.Hook) []logrus.Entry {
	var out []logrus.Entry
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.InfoLevel {
			out = append(out, *e)
		}
	}
	return out
}

func loadCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := parseCert(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cert
}

func loadKey(t *testing.T, path string) *ecdsa.PrivateKey {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	key, err := parseKey(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		t.Fatalf("%s: key is %T, want ECDSA P-256", path, key)
	}
	return ec
}

type leafCase struct {
	name   string
	files  Pair
	ca     string
	usages []x509.ExtKeyUsage
	cn     string
	orgs   []string
}

func leafCases(f Files) []leafCase {
	masters := []string{"system:masters"}
	return []leafCase{
		{"apiserver", f.APIServer, f.ServerCA.Cert, serverAuth, "kube-apiserver", nil},
		{"admin", f.Admin, f.ClientCA.Cert, clientAuth, "system:admin", masters},
		{"controller-manager", f.ControllerManager, f.ClientCA.Cert, clientAuth, "system:kube-controller-manager", nil},
		{"scheduler", f.Scheduler, f.ClientCA.Cert, clientAuth, "system:kube-scheduler", nil},
		{"apiserver-kubelet-client", f.APIServerKubeletClient, f.ClientCA.Cert, clientAuth, "system:kube-apiserver", masters},
		{"kubelet-client", f.KubeletClient, f.ClientCA.Cert, clientAuth, "system:node:node-1", []string{"system:nodes"}},
		{"kubelet-serving", f.KubeletServing, f.KubeletCA.Cert, serverAuth, "node-1", nil},
		{"kube-proxy", f.KubeProxy, f.ClientCA.Cert, clientAuth, "system:kube-proxy", nil},
		{"dns", f.DNS, f.ClientCA.Cert, clientAuth, "system:kelp-dns", nil},
		{"controller", f.Controller, f.ClientCA.Cert, clientAuth, "system:kelp-controller:node-1", []string{"system:kelp-controllers"}},
		{"auth-proxy", f.AuthProxy, f.RequestHeaderCA.Cert, clientAuth, "system:auth-proxy", nil},
		{"etcd-server", f.EtcdServer, f.EtcdServerCA.Cert, serverClientAuth, "etcd-server", nil},
		{"etcd-client", f.EtcdClient, f.EtcdServerCA.Cert, clientAuth, "etcd-client", nil},
		{"etcd-peer", f.EtcdPeer, f.EtcdPeerCA.Cert, serverClientAuth, "etcd-peer", nil},
	}
}

func TestEnsureCreatesEverything(t *testing.T) {
	cfg := testConfig(t)
	f, hook := run(t, cfg)

	wantNames := []string{
		"client-admin.crt", "client-admin.key", "client-auth-proxy.crt", "client-auth-proxy.key",
		"client-ca-signer.crt", "client-ca.crt", "client-ca.key", "client-controller.crt", "client-controller.key",
		"client-kelp-controller.crt", "client-kelp-controller.key", "client-kelp-dns.crt", "client-kelp-dns.key",
		"client-kube-apiserver.crt", "client-kube-apiserver.key", "client-kube-proxy.crt", "client-kube-proxy.key",
		"client-kubelet.crt", "client-kubelet.key",
		"client-scheduler.crt", "client-scheduler.key", "etcd",
		"kubelet-ca-signer.crt", "kubelet-ca.crt", "kubelet-ca.key", "kubelet-trust.crt",
		"request-header-ca.crt", "request-header-ca.key", "server-ca-signer.crt", "server-ca.crt", "server-ca.key",
		"service.key", "service.pub", "serving-kube-apiserver.crt", "serving-kube-apiserver.key",
		"serving-kubelet.crt", "serving-kubelet.key",
	}
	wantEtcdNames := []string{
		"client.crt", "client.key", "peer-ca.crt", "peer-ca.key",
		"peer-server-client.crt", "peer-server-client.key",
		"server-ca.crt", "server-ca.key", "server-client.crt", "server-client.key",
	}
	for dir, want := range map[string][]string{cfg.Dir: wantNames, filepath.Join(cfg.Dir, "etcd"): wantEtcdNames} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, want) {
			t.Errorf("%s holds %v, want %v", dir, names, want)
		}
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o700 {
			t.Errorf("%s mode = %04o, want 0700", dir, st.Mode().Perm())
		}
	}

	for _, p := range f.all() {
		if !filepath.IsAbs(p) {
			t.Errorf("path %q is not absolute", p)
		}
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %04o, want 0600", p, st.Mode().Perm())
		}
	}

	for _, ca := range []Pair{f.ServerCA, f.ClientCA, f.KubeletCA, f.RequestHeaderCA, f.EtcdServerCA, f.EtcdPeerCA} {
		cert := loadCert(t, ca.Cert)
		key := loadKey(t, ca.Key)
		if !cert.IsCA || cert.CheckSignatureFrom(cert) != nil {
			t.Errorf("%s is not a self-signed CA", ca.Cert)
		}
		if !samePublicKey(cert.PublicKey, key.Public()) {
			t.Errorf("%s does not match its key", ca.Cert)
		}
		if got, want := cert.NotAfter, t0.Add(caValidity); !got.Equal(want) {
			t.Errorf("%s NotAfter = %v, want %v", ca.Cert, got, want)
		}
	}

	for _, tc := range leafCases(f) {
		t.Run(tc.name, func(t *testing.T) {
			cert := loadCert(t, tc.files.Cert)
			key := loadKey(t, tc.files.Key)
			if !samePublicKey(cert.PublicKey, key.Public()) {
				t.Error("key does not match certificate")
			}
			roots := x509.NewCertPool()
			roots.AddCert(loadCert(t, tc.ca))
			for _, usage := range tc.usages {
				opts := x509.VerifyOptions{Roots: roots, CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{usage}}
				if _, err := cert.Verify(opts); err != nil {
					t.Errorf("verify for usage %v: %v", usage, err)
				}
			}
			if cert.Subject.CommonName != tc.cn || !slices.Equal(cert.Subject.Organization, tc.orgs) {
				t.Errorf("subject = %v, want CN=%s O=%v", cert.Subject, tc.cn, tc.orgs)
			}
			if !slices.Equal(cert.ExtKeyUsage, tc.usages) {
				t.Errorf("ExtKeyUsage = %v, want %v", cert.ExtKeyUsage, tc.usages)
			}
			if got, want := cert.NotAfter, t0.Add(leafValidity); !got.Equal(want) {
				t.Errorf("NotAfter = %v, want %v", got, want)
			}
		})
	}

	// One Info line per created CA, leaf and key file; nothing louder.
	if got, want := len(infoEntries(hook)), 6+2+14; got != want {
		t.Errorf("logged %d entries at Info or above, want %d", got, want)
	}
	for _, e := range hook.AllEntries() {
		if e.Level != logrus.InfoLevel || e.Data["component"] != "pki" {
			t.Errorf("unexpected log entry: %v %q %v", e.Level, e.Message, e.Data)
		}
	}
}

func TestEnsureSANs(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)

	sans := func(path string) (dns, ips []string) {
		cert := loadCert(t, path)
		for _, ip := range cert.IPAddresses {
			ips = append(ips, ip.String())
		}
		return cert.DNSNames, ips
	}
	tests := []struct {
		name    string
		cert    string
		wantDNS []string
		wantIPs []string
	}{
		{
			name: "apiserver",
			cert: f.APIServer.Cert,
			wantDNS: []string{
				"node-1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
				"kubernetes.default.svc.cluster.local", "kelp.example.com",
			},
			wantIPs: []string{"127.0.0.1", "::1", "192.168.1.10", "fd00::10", "10.43.0.1", "203.0.113.7"},
		},
		{
			name:    "etcd-server",
			cert:    f.EtcdServer.Cert,
			wantDNS: []string{"node-1", "localhost"},
			wantIPs: []string{"127.0.0.1", "::1", "192.168.1.10", "fd00::10"},
		},
		{
			name:    "etcd-peer",
			cert:    f.EtcdPeer.Cert,
			wantDNS: []string{"node-1", "localhost"},
			wantIPs: []string{"127.0.0.1", "::1", "192.168.1.10", "fd00::10"},
		},
		{name: "admin", cert: f.Admin.Cert},
		{name: "etcd-client", cert: f.EtcdClient.Cert},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dns, ips := sans(tc.cert)
			slices.Sort(dns)
			slices.Sort(ips)
			wantDNS, wantIPs := sorted(tc.wantDNS...), sorted(tc.wantIPs...)
			if !slices.Equal(dns, wantDNS) {
				t.Errorf("DNS SANs = %v, want %v", dns, wantDNS)
			}
			if !slices.Equal(ips, wantIPs) {
				t.Errorf("IP SANs = %v, want %v", ips, wantIPs)
			}
		})
	}

	// The serving cert must verify for every name clients use.
	roots := x509.NewCertPool()
	roots.AddCert(loadCert(t, f.ServerCA.Cert))
	cert := loadCert(t, f.APIServer.Cert)
	for _, name := range []string{"kubernetes.default.svc.cluster.local", "kelp.example.com", "10.43.0.1", "203.0.113.7", "localhost"} {
		opts := x509.VerifyOptions{Roots: roots, CurrentTime: t0, DNSName: name}
		if _, err := cert.Verify(opts); err != nil {
			t.Errorf("verify as %s: %v", name, err)
		}
	}
}

func TestEnsureIsIdempotent(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	before := snapshot(t, f)

	f2, hook := run(t, at(cfg, t0.Add(time.Hour)))
	if f2 != f {
		t.Errorf("second Ensure returned %+v, want %+v", f2, f)
	}
	if got := changed(before, snapshot(t, f)); len(got) > 0 {
		t.Errorf("second Ensure changed %v", got)
	}
	if entries := hook.AllEntries(); len(entries) > 0 {
		t.Errorf("second Ensure logged %d entries, first: %q", len(entries), entries[0].Message)
	}
}

func TestEnsureRenewsNearExpiry(t *testing.T) {
	tests := []struct {
		name       string
		later      time.Duration
		reissued   bool
		wantReason string
	}{
		{name: "200 days left", later: 165 * 24 * time.Hour},
		{name: "121 days left", later: 244 * 24 * time.Hour},
		{name: "100 days left", later: 265 * 24 * time.Hour, reissued: true, wantReason: "expires in 100 days"},
		{name: "99 days left", later: 266 * 24 * time.Hour, reissued: true, wantReason: "expires in 99 days"},
		{name: "expired", later: 400 * 24 * time.Hour, reissued: true, wantReason: "expired 35 days ago"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			f, _ := run(t, cfg)
			before := snapshot(t, f)

			now := t0.Add(tc.later)
			_, hook := run(t, at(cfg, now))

			var wantChanged []string
			if tc.reissued {
				for _, l := range leafCases(f) {
					wantChanged = append(wantChanged, l.files.Cert, l.files.Key)
				}
			}
			if got, want := changed(before, snapshot(t, f)), sorted(wantChanged...); !slices.Equal(got, want) {
				t.Errorf("changed %v, want %v", got, want)
			}
			entries := infoEntries(hook)
			if len(entries) != len(wantChanged)/2 {
				t.Errorf("logged %d Info entries, want %d", len(entries), len(wantChanged)/2)
			}
			for _, e := range entries {
				if e.Data["reason"] != tc.wantReason {
					t.Errorf("%v: reason %q, want %q", e.Data["cert"], e.Data["reason"], tc.wantReason)
				}
			}
			if tc.reissued {
				cert := loadCert(t, f.APIServer.Cert)
				if got, want := cert.NotAfter, now.Add(leafValidity); !got.Equal(want) {
					t.Errorf("renewed NotAfter = %v, want %v", got, want)
				}
			}
		})
	}
}

// Near the end of a CA's life a leaf gets the CA's NotAfter, and then stays:
// reissuing it again would not make it last any longer.
func TestEnsureLeafNeverOutlivesCA(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	late := t0.Add(caValidity - 70*24*time.Hour)

	_, hook := run(t, at(cfg, late))
	caEnd := loadCert(t, f.ServerCA.Cert).NotAfter
	if got := loadCert(t, f.APIServer.Cert).NotAfter; !got.Equal(caEnd) {
		t.Errorf("leaf NotAfter = %v, want the CA's %v", got, caEnd)
	}
	warned := false
	for _, e := range hook.AllEntries() {
		warned = warned || e.Level == logrus.WarnLevel && strings.Contains(e.Message, "expires in 70 days")
	}
	if !warned {
		t.Error("no warning that the CA expires soon")
	}

	before := snapshot(t, f)
	run(t, at(cfg, late.Add(24*time.Hour)))
	if got := changed(before, snapshot(t, f)); len(got) > 0 {
		t.Errorf("Ensure a day later changed %v", got)
	}
}

func TestEnsureReissuesOnlyWhatChanged(t *testing.T) {
	base := testConfig(t)
	f := FilesIn(base.Dir)
	tests := []struct {
		name        string
		mutate      func(*Config)
		wantChanged []string
		wantReason  string
	}{
		{
			name: "extra SANs reordered and recased",
			mutate: func(c *Config) {
				c.ExtraSANs = []string{"KELP.example.com.", "203.0.113.7", "localhost"}
				c.Hostname = "Node-1"
			},
		},
		{
			name:        "extra IP SAN added",
			mutate:      func(c *Config) { c.ExtraSANs = append(c.ExtraSANs, "10.0.0.5") },
			wantChanged: []string{f.APIServer.Cert, f.APIServer.Key},
			wantReason:  "SANs changed: added 10.0.0.5",
		},
		{
			name:        "extra DNS SAN replaced",
			mutate:      func(c *Config) { c.ExtraSANs = []string{"203.0.113.7", "api.example.org"} },
			wantChanged: []string{f.APIServer.Cert, f.APIServer.Key},
			wantReason:  "SANs changed: added api.example.org; removed kelp.example.com",
		},
		{
			name:        "node IP changed",
			mutate:      func(c *Config) { c.IPs = []net.IP{net.ParseIP("192.168.1.11")} },
			wantChanged: []string{f.APIServer.Cert, f.APIServer.Key, f.EtcdServer.Cert, f.EtcdServer.Key, f.EtcdPeer.Cert, f.EtcdPeer.Key, f.KubeletServing.Cert, f.KubeletServing.Key},
			wantReason:  "SANs changed: added 192.168.1.11; removed 192.168.1.10, fd00::10",
		},
		{
			name:        "cluster domain changed",
			mutate:      func(c *Config) { c.ClusterDomain = "example.internal" },
			wantChanged: []string{f.APIServer.Cert, f.APIServer.Key},
			wantReason:  "SANs changed: added kubernetes.default.svc.example.internal; removed kubernetes.default.svc.cluster.local",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			f, _ := run(t, cfg)
			before := snapshot(t, f)

			tc.mutate(&cfg)
			_, hook := run(t, cfg)

			// The table was built for base.Dir; rebase onto this run's dir.
			var want []string
			for _, p := range tc.wantChanged {
				rel, _ := filepath.Rel(base.Dir, p)
				want = append(want, filepath.Join(cfg.Dir, rel))
			}
			if got, want := changed(before, snapshot(t, f)), sorted(want...); !slices.Equal(got, want) {
				t.Errorf("changed %v, want %v", got, want)
			}
			for _, e := range infoEntries(hook) {
				if e.Data["reason"] != tc.wantReason {
					t.Errorf("%v: reason %q, want %q", e.Data["cert"], e.Data["reason"], tc.wantReason)
				}
			}
		})
	}
}

func TestEnsureRepairsDamagedLeaf(t *testing.T) {
	otherKey, err := newKey()
	if err != nil {
		t.Fatal(err)
	}
	otherKeyPEM, err := encodeKey(otherKey)
	if err != nil {
		t.Fatal(err)
	}
	// Every case damages the serving cert, which is then the only thing
	// Ensure may touch.
	tests := []struct {
		name       string
		damage     func(t *testing.T, f Files)
		wantReason string
	}{
		{
			name:       "cert missing",
			damage:     func(t *testing.T, f Files) { remove(t, f.APIServer.Cert) },
			wantReason: "missing",
		},
		{
			name:       "key missing",
			damage:     func(t *testing.T, f Files) { remove(t, f.APIServer.Key) },
			wantReason: "key missing",
		},
		{
			name:       "key does not match",
			damage:     func(t *testing.T, f Files) { write(t, f.APIServer.Key, otherKeyPEM) },
			wantReason: "key does not match certificate",
		},
		{
			name: "cert truncated",
			damage: func(t *testing.T, f Files) {
				data, err := os.ReadFile(f.APIServer.Cert)
				if err != nil {
					t.Fatal(err)
				}
				write(t, f.APIServer.Cert, data[:len(data)/2])
			},
			wantReason: "certificate unparseable: no CERTIFICATE PEM block",
		},
		{
			name: "signed by another CA",
			// A client-ca leaf is no good in the server-ca's place.
			damage: func(t *testing.T, f Files) {
				copyFile(t, f.Scheduler.Cert, f.APIServer.Cert)
				copyFile(t, f.Scheduler.Key, f.APIServer.Key)
			},
			wantReason: "not signed by the current CA",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			f, _ := run(t, cfg)
			tc.damage(t, f)
			before := snapshot(t, f)

			_, hook := run(t, cfg)
			entries := infoEntries(hook)
			if len(entries) != 1 || entries[0].Data["reason"] != tc.wantReason {
				t.Fatalf("logged %v, want one entry with reason %q", entries, tc.wantReason)
			}
			roots := x509.NewCertPool()
			roots.AddCert(loadCert(t, f.ServerCA.Cert))
			cert := loadCert(t, f.APIServer.Cert)
			if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: t0}); err != nil {
				t.Errorf("repaired cert does not verify: %v", err)
			}
			if !samePublicKey(cert.PublicKey, loadKey(t, f.APIServer.Key).Public()) {
				t.Error("repaired cert does not match its key")
			}
			if got, want := changed(before, snapshot(t, f)), sorted(f.APIServer.Cert, f.APIServer.Key); !slices.Equal(got, want) {
				t.Errorf("changed %v, want %v", got, want)
			}
		})
	}
}

func TestEnsureNeverReplacesCA(t *testing.T) {
	tests := []struct {
		name     string
		damage   func(t *testing.T, f Files)
		wantFile func(f Files) string
		wantText string
	}{
		{
			name:     "key missing",
			damage:   func(t *testing.T, f Files) { remove(t, f.ServerCA.Key) },
			wantFile: func(f Files) string { return f.ServerCA.Key },
			wantText: "is missing",
		},
		{
			name:     "key of another CA",
			damage:   func(t *testing.T, f Files) { copyFile(t, f.ClientCA.Key, f.ServerCA.Key) },
			wantFile: func(f Files) string { return f.ServerCA.Key },
			wantText: "does not match certificate",
		},
		{
			name:     "key garbage",
			damage:   func(t *testing.T, f Files) { write(t, f.EtcdPeerCA.Key, []byte("not a key")) },
			wantFile: func(f Files) string { return f.EtcdPeerCA.Key },
			wantText: "is unreadable",
		},
		{
			name: "cert garbage",
			damage: func(t *testing.T, f Files) {
				write(t, f.RequestHeaderCA.Cert, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
			},
			wantFile: func(f Files) string { return f.RequestHeaderCA.Cert },
			wantText: "is unparseable",
		},
		{
			name: "cert is a leaf",
			damage: func(t *testing.T, f Files) {
				copyFile(t, f.Admin.Cert, f.ClientCA.Cert)
				copyFile(t, f.Admin.Key, f.ClientCA.Key)
			},
			wantFile: func(f Files) string { return f.ClientCA.Cert },
			wantText: "is not a CA certificate",
		},
		{
			name:     "service-account key garbage",
			damage:   func(t *testing.T, f Files) { write(t, f.ServiceAccountKey, []byte("garbage")) },
			wantFile: func(f Files) string { return f.ServiceAccountKey },
			wantText: "invalidates every service-account token",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			f, _ := run(t, cfg)
			tc.damage(t, f)
			before := map[string][]byte{}
			for _, p := range f.all() {
				before[p], _ = os.ReadFile(p)
			}

			_, err := ensure(cfg, logrus.New())
			if err == nil {
				t.Fatal("Ensure succeeded, want an error")
			}
			if file := tc.wantFile(f); !strings.Contains(err.Error(), file) {
				t.Errorf("error %q does not name %s", err, file)
			}
			if !strings.Contains(err.Error(), tc.wantText) {
				t.Errorf("error %q does not say %q", err, tc.wantText)
			}
			if !strings.Contains(err.Error(), "restore") {
				t.Errorf("error %q does not say what to do", err)
			}
			for _, p := range f.all() {
				after, _ := os.ReadFile(p)
				if !bytes.Equal(before[p], after) {
					t.Errorf("%s was rewritten", p)
				}
			}
		})
	}
}

// A crash while creating a CA can leave its key without a certificate; the
// next start completes the CA with that same key.
func TestEnsureCompletesCAFromExistingKey(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	keyBefore, err := os.ReadFile(f.ServerCA.Key)
	if err != nil {
		t.Fatal(err)
	}
	remove(t, f.ServerCA.Cert)

	run(t, cfg)
	keyAfter, err := os.ReadFile(f.ServerCA.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(keyBefore, keyAfter) {
		t.Error("CA key was replaced")
	}
	ca := loadCert(t, f.ServerCA.Cert)
	if !ca.IsCA || !samePublicKey(ca.PublicKey, loadKey(t, f.ServerCA.Key).Public()) {
		t.Error("recreated CA certificate does not match the existing key")
	}
}

// An operator may install a CA of their own; leaves follow it.
func TestEnsureReissuesLeavesOfReplacedCA(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)

	other, _ := run(t, testConfig(t))
	copyFile(t, other.ServerCA.Cert, f.ServerCA.Cert)
	copyFile(t, other.ServerCA.Key, f.ServerCA.Key)
	before := snapshot(t, f)

	_, hook := run(t, cfg)
	if got, want := changed(before, snapshot(t, f)), sorted(f.APIServer.Cert, f.APIServer.Key); !slices.Equal(got, want) {
		t.Errorf("changed %v, want %v", got, want)
	}
	if e := infoEntries(hook); len(e) != 1 || e[0].Data["reason"] != "not signed by the current CA" {
		t.Errorf("logged %v", e)
	}
	roots := x509.NewCertPool()
	roots.AddCert(loadCert(t, other.ServerCA.Cert))
	if _, err := loadCert(t, f.APIServer.Cert).Verify(x509.VerifyOptions{Roots: roots, CurrentTime: t0}); err != nil {
		t.Errorf("serving cert does not verify against the installed CA: %v", err)
	}
}

func TestEnsureServiceAccountKey(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	key := loadKey(t, f.ServiceAccountKey)
	keyPEM, _ := os.ReadFile(f.ServiceAccountKey)

	tests := []struct {
		name       string
		damage     func(t *testing.T)
		wantReason string
	}{
		{"pub missing", func(t *testing.T) { remove(t, f.ServiceAccountPub) }, "missing"},
		{"pub garbage", func(t *testing.T) { write(t, f.ServiceAccountPub, []byte("junk")) }, "unparseable"},
		{"pub of another key", func(t *testing.T) { copyPub(t, f.ServiceAccountPub) }, "does not match " + f.ServiceAccountKey},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.damage(t)
			_, hook := run(t, cfg)
			if e := infoEntries(hook); len(e) != 1 || e[0].Data["reason"] != tc.wantReason {
				t.Errorf("logged %v, want one entry with reason %q", e, tc.wantReason)
			}
			pubPEM, err := os.ReadFile(f.ServiceAccountPub)
			if err != nil {
				t.Fatal(err)
			}
			pub, err := parsePublicKey(pubPEM)
			if err != nil || !samePublicKey(pub, key.Public()) {
				t.Errorf("service.pub does not hold the key's public half (err %v)", err)
			}
			if after, _ := os.ReadFile(f.ServiceAccountKey); !bytes.Equal(after, keyPEM) {
				t.Error("service.key was replaced")
			}
		})
	}
}

func TestEnsureRemovesLeftoverTempFiles(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	// Named as atomicfile names its temporary files.
	leftovers := []string{
		filepath.Join(cfg.Dir, ".server-ca.key.tmp-123"),
		filepath.Join(cfg.Dir, "etcd", ".client.crt.tmp-456"),
	}
	for _, p := range leftovers {
		write(t, p, []byte("half a file"))
	}
	before := snapshot(t, f)

	run(t, cfg)
	for _, p := range leftovers {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still exists (err %v)", p, err)
		}
	}
	if got := changed(before, snapshot(t, f)); len(got) > 0 {
		t.Errorf("changed %v", got)
	}
}

// Earlier versions issued system:kelp-supervisor, a cluster-admin
// credential nothing used; its files go at the next start.
func TestEnsureRemovesRetiredCredential(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	retired := []string{filepath.Join(cfg.Dir, "client-kelp-supervisor.crt"), filepath.Join(cfg.Dir, "client-kelp-supervisor.key")}
	for _, p := range retired {
		write(t, p, []byte("system:masters"))
	}
	before := snapshot(t, f)

	_, hook := run(t, cfg)
	for _, p := range retired {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still exists (err %v)", p, err)
		}
	}
	if got := changed(before, snapshot(t, f)); len(got) > 0 {
		t.Errorf("changed %v", got)
	}
	var removed []string
	for _, e := range infoEntries(hook) {
		removed = append(removed, e.Data["file"].(string))
	}
	if !slices.Equal(removed, retired) {
		t.Errorf("logged the removal of %v, want %v", removed, retired)
	}
}

// A server made before each node had its own controller identity holds
// the one all nodes shared; its next start gives its node its own.
func TestEnsureMovesTheControllerToTheNodesIdentity(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	ca, err := loadAuthority(f.ClientCA)
	if err != nil {
		t.Fatal(err)
	}
	is := issuer{now: time.Now().UTC(), log: logrus.New()}
	shared, err := is.issue(leafSpec{ca: ca, cn: "system:kelp-controller", usages: clientAuth})
	if err != nil {
		t.Fatal(err)
	}
	write(t, f.Controller.Cert, shared.Cert)
	write(t, f.Controller.Key, shared.Key)

	run(t, cfg)
	cert := loadCert(t, f.Controller.Cert)
	if cert.Subject.CommonName != "system:kelp-controller:node-1" || !slices.Equal(cert.Subject.Organization, []string{"system:kelp-controllers"}) {
		t.Errorf("the node's controllers are CN=%s O=%v after Ensure, want CN=system:kelp-controller:node-1 O=[system:kelp-controllers]", cert.Subject.CommonName, cert.Subject.Organization)
	}
}

func TestFilesIn(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	if got := FilesIn(cfg.Dir); got != f {
		t.Errorf("FilesIn = %+v, want what Ensure returned, %+v", got, f)
	}
	if got, want := FilesIn("/tls").ServerCA, (Pair{Cert: "/tls/server-ca.crt", Key: "/tls/server-ca.key"}); got != want {
		t.Errorf("ServerCA = %+v, want %+v", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{name: "valid", mutate: func(*Config) {}},
		{name: "wildcard SAN", mutate: func(c *Config) { c.ExtraSANs = []string{"*.example.com"} }},
		{name: "no dir", mutate: func(c *Config) { c.Dir = "" }, wantErr: "directory"},
		{name: "no hostname", mutate: func(c *Config) { c.Hostname = " " }, wantErr: "hostname"},
		{name: "no service IP", mutate: func(c *Config) { c.ServiceIP = nil }, wantErr: "service IP"},
		{name: "no cluster domain", mutate: func(c *Config) { c.ClusterDomain = "" }, wantErr: "cluster domain"},
		{name: "bad node IP", mutate: func(c *Config) { c.IPs = []net.IP{{1, 2}} }, wantErr: "node IP"},
		{name: "empty SAN", mutate: func(c *Config) { c.ExtraSANs = []string{""} }, wantErr: "--tls-san"},
		{name: "SAN with space", mutate: func(c *Config) { c.ExtraSANs = []string{"a b.example.com"} }, wantErr: "--tls-san"},
		{name: "SAN with scheme", mutate: func(c *Config) { c.ExtraSANs = []string{"https://example.com"} }, wantErr: "--tls-san"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			tc.mutate(&cfg)
			err := cfg.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Validate = %v, want an error about %q", err, tc.wantErr)
			}
		})
	}
}

func TestCAHash(t *testing.T) {
	const want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" // sha256("abc")
	if got := CAHash([]byte("abc")); got != want {
		t.Errorf("CAHash = %s, want %s", got, want)
	}
}

func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	write(t, to, data)
}

func copyPub(t *testing.T, to string) {
	t.Helper()
	key, err := newKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := encodePublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	write(t, to, pub)
}
