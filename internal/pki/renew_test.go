package pki

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
)

// A leaf is due in the last 120/365 of its life: 120 days of a year, 79
// seconds of four minutes.
func TestRenewalWindow(t *testing.T) {
	for lifetime, want := range map[time.Duration]time.Duration{
		0:                        renewBefore,
		leafValidity:             renewBefore,
		4 * time.Minute:          78904109589 * time.Nanosecond,
		365 * time.Minute:        120 * time.Minute,
		73 * 24 * time.Hour:      24 * 24 * time.Hour,
		-5 * 24 * time.Hour:      renewBefore,
		2 * 365 * 24 * time.Hour: 2 * renewBefore,
	} {
		if got := RenewalWindow(lifetime); got != want {
			t.Errorf("RenewalWindow(%s) = %s, want %s", lifetime, got, want)
		}
	}
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	if got, want := renewAt(loadCert(t, f.APIServer.Cert)), t0.Add(leafValidity-renewBefore); !got.Equal(want) {
		t.Errorf("a year-long leaf is due at %v, want %v", got, want)
	}
	cfg.LeafLifetime = 4 * time.Minute
	run(t, cfg)
	if got, want := renewAt(loadCert(t, f.APIServer.Cert)), t0.Add(4*time.Minute-RenewalWindow(4*time.Minute)); !got.Equal(want) {
		t.Errorf("a four-minute leaf is due at %v, want %v", got, want)
	}
}

// A shorter lifetime applies at once to the leaves there are; leaves that
// already live that long stay.
func TestEnsureShortensLifetime(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	cfg.LeafLifetime = 4 * time.Minute
	_, hook := run(t, cfg)
	entries := infoEntries(hook)
	if len(entries) != len(f.Leaves()) {
		t.Errorf("reissued %d leaves, want %d", len(entries), len(f.Leaves()))
	}
	for _, e := range entries {
		if e.Data["reason"] != "lives longer than the leaf lifetime of 4m0s" {
			t.Errorf("%v: reason %q", e.Data["cert"], e.Data["reason"])
		}
	}
	for _, p := range f.Leaves() {
		if got := loadCert(t, p.Cert).NotAfter; !got.Equal(t0.Add(4 * time.Minute)) {
			t.Errorf("%s expires %v, want in 4 minutes", p.Cert, got)
		}
	}
	before := snapshot(t, f)
	run(t, at(cfg, t0.Add(time.Minute)))
	if got := changed(before, snapshot(t, f)); len(got) > 0 {
		t.Errorf("Ensure a minute later changed %v", got)
	}
}

// Renew reissues the leaves that are due, says which, and makes nothing
// that is missing: a CA gone while the server runs is an error.
func TestRenew(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeafLifetime = 4 * time.Minute
	f, _ := run(t, cfg)
	logger := discardLogger()
	before := snapshot(t, f)
	if renewed, err := renew(at(cfg, t0.Add(2*time.Minute)), logger); err != nil || len(renewed) > 0 {
		t.Errorf("two minutes in: renewed %v, %v", renewed, err)
	}
	if got := changed(before, snapshot(t, f)); len(got) > 0 {
		t.Errorf("renewing nothing changed %v", got)
	}

	later := t0.Add(3 * time.Minute)
	renewed, err := renew(at(cfg, later), logger)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(renewed, f.Leaves()) {
		t.Errorf("three minutes in: renewed %v, want every leaf", renewed)
	}
	var wantChanged []string
	for _, p := range f.Leaves() {
		wantChanged = append(wantChanged, p.Cert, p.Key)
		if got := loadCert(t, p.Cert).NotAfter; !got.Equal(later.Add(4 * time.Minute)) {
			t.Errorf("%s expires %v, want %v", p.Cert, got, later.Add(4*time.Minute))
		}
	}
	if got, want := changed(before, snapshot(t, f)), sorted(wantChanged...); !slices.Equal(got, want) {
		t.Errorf("changed %v, want %v", got, want)
	}

	if err := os.Remove(f.ClientCA.Key); err != nil {
		t.Fatal(err)
	}
	_, err = renew(at(cfg, t0.Add(10*time.Minute)), logger)
	if err == nil || !strings.Contains(err.Error(), f.ClientCA.Cert) || !strings.Contains(err.Error(), "restore it from backup") {
		t.Errorf("a missing CA key: %v", err)
	}
	if _, err := os.Stat(f.ClientCA.Key); !os.IsNotExist(err) {
		t.Errorf("Renew made a CA key: %v", err)
	}
}

func TestNextExpiry(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	// The admin's leaf is renewed a minute in, so it is due last.
	cfg.LeafLifetime = 4 * time.Minute
	run(t, cfg)
	if _, err := renew(at(cfg, t0.Add(3*time.Minute)), discardLogger()); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(f.Admin.Cert); err != nil {
		t.Fatal(err)
	}
	if _, err := renew(at(cfg, t0.Add(4*time.Minute)), discardLogger()); err != nil {
		t.Fatal(err)
	}
	got := NextExpiry([]Pair{f.Admin, f.APIServer})
	want := Expiry{Cert: f.APIServer.Cert, RenewAt: t0.Add(7*time.Minute - RenewalWindow(4*time.Minute)), NotAfter: t0.Add(7 * time.Minute)}
	if got != want {
		t.Errorf("NextExpiry = %+v, want %+v", got, want)
	}
	if err := os.Remove(f.APIServer.Cert); err != nil {
		t.Fatal(err)
	}
	if got := NextExpiry([]Pair{f.Admin, f.APIServer}); got != (Expiry{Cert: f.APIServer.Cert}) {
		t.Errorf("a missing leaf: %+v, want due now", got)
	}
}

// `kelp certificate check` says WARN for a leaf in its renewal window,
// whatever its lifetime, and for a CA in its last 120 days.
func TestCheckWindow(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeafLifetime = 4 * time.Minute
	f, _ := run(t, cfg)
	for after, want := range map[time.Duration]string{2 * time.Minute: StatusOK, 3 * time.Minute: StatusWarn, 5 * time.Minute: StatusExpired} {
		list, err := Check(cfg.Dir, t0.Add(after))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			want := want
			if s.CA {
				want = StatusOK
			}
			if s.Status != want {
				t.Errorf("%s after %s: %s, want %s", s.Path, after, s.Status, want)
			}
		}
	}
	list, err := Check(cfg.Dir, t0.Add(caValidity-100*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.Path == f.ServerCA.Cert && s.Status != StatusWarn {
			t.Errorf("a CA with 100 days left: %s", s.Status)
		}
	}
}

func discardLogger() logrus.FieldLogger {
	logger, _ := logtest.NewNullLogger()
	return logger
}

// A node's renewed credentials replace its leaves and leave its CAs; a
// set that lacks one is refused before anything is written.
func TestWriteRenewed(t *testing.T) {
	f, _ := run(t, testConfig(t))
	joined, err := IssueNode(f, "agent-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	serverCA, _ := os.ReadFile(f.ServerCA.Cert)
	clientCA, _ := os.ReadFile(f.ClientCA.Cert)
	node := NodeFilesIn(t.TempDir())
	if err := node.Write(serverCA, clientCA, joined); err != nil {
		t.Fatal(err)
	}
	renewed, err := IssueNode(f, "agent-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	incomplete := renewed
	incomplete.DNS.Key = nil
	if err := node.WriteRenewed(serverCA, clientCA, incomplete); err == nil || !strings.Contains(err.Error(), "client-kelp-dns.key") {
		t.Errorf("renewed credentials without the DNS key: %v", err)
	}
	if got, _ := os.ReadFile(node.KubeletClient.Cert); string(got) != string(joined.KubeletClient.Cert) {
		t.Error("an incomplete renewal wrote the kubelet's client certificate")
	}
	if err := node.WriteRenewed(serverCA, clientCA, renewed); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string][]byte{
		node.KubeletClient.Cert: renewed.KubeletClient.Cert, node.KubeletClient.Key: renewed.KubeletClient.Key,
		node.Controller.Cert: renewed.Controller.Cert, node.ServerCA: serverCA, node.ClientCA: clientCA,
	} {
		if got, err := os.ReadFile(path); err != nil || string(got) != string(want) {
			t.Errorf("%s: %v, not what was written", path, err)
		}
	}
	if temps, _ := filepath.Glob(filepath.Join(filepath.Dir(node.KubeletClient.Cert), ".*")); len(temps) > 0 {
		t.Errorf("left behind %v", temps)
	}
}

// A joining node's leaves live as long as the server's own: the join API
// learns a test's lifetime from them.
func TestNodeLeafLifetime(t *testing.T) {
	cfg := testConfig(t)
	f, _ := run(t, cfg)
	if got := f.leafLifetime(); got != leafValidity {
		t.Errorf("beside year-long leaves: %s", got)
	}
	cfg.LeafLifetime = 4 * time.Minute
	run(t, cfg)
	if got := f.leafLifetime(); got != 4*time.Minute {
		t.Errorf("beside four-minute leaves: %s", got)
	}
	node, err := IssueNode(f, "agent-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := parseCert(node.KubeletClient.Cert)
	if err != nil {
		t.Fatal(err)
	}
	if life := cert.NotAfter.Sub(cert.NotBefore); life != 4*time.Minute+backdate {
		t.Errorf("a joining node's leaf lives %s, want 4m", life-backdate)
	}
	if err := os.Remove(f.KubeletClient.Cert); err != nil {
		t.Fatal(err)
	}
	if got := f.leafLifetime(); got != leafValidity {
		t.Errorf("without the server's kubelet client certificate: %s", got)
	}
}
