package certificate

import (
	"bytes"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func serverDir(t *testing.T) (string, pki.Config) {
	t.Helper()
	dataDir := t.TempDir()
	cfg := pki.Config{
		Dir: layout.Server(dataDir).TLS, Hostname: "server-1", IPs: []net.IP{net.ParseIP("10.0.0.1")},
		ServiceIP: net.ParseIP("10.43.0.1"), ClusterDomain: "cluster.local", Now: func() time.Time { return t0 },
	}
	if _, err := pki.Ensure(cfg); err != nil {
		t.Fatal(err)
	}
	return dataDir, cfg
}

func exitCode(err error) int {
	var coder cli.ExitCoder
	if errors.As(err, &coder) {
		return coder.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// Leaves last a year and are renewed in their last 120 days; CAs last ten.
func TestCheck(t *testing.T) {
	dataDir, _ := serverDir(t)
	for _, tc := range []struct {
		after      time.Duration
		code       int
		leaf, ca   string
		daysLeafIn string
	}{
		{30 * 24 * time.Hour, 0, pki.StatusOK, pki.StatusOK, "335"},
		{300 * 24 * time.Hour, exitWarn, pki.StatusWarn, pki.StatusOK, "65"},
		{400 * 24 * time.Hour, exitExpired, pki.StatusExpired, pki.StatusOK, "-35"},
	} {
		var out bytes.Buffer
		err := check(&out, dataDir, t0.Add(tc.after))
		if code := exitCode(err); code != tc.code {
			t.Errorf("after %s: exit status %d (%v), want %d", tc.after, code, err, tc.code)
		}
		for _, line := range strings.Split(out.String(), "\n") {
			switch {
			case strings.Contains(line, "serving-kube-apiserver.crt"):
				if !strings.HasSuffix(line, tc.leaf) || !strings.Contains(line, " "+tc.daysLeafIn+" ") {
					t.Errorf("after %s: %q, want %s with %s days left", tc.after, line, tc.leaf, tc.daysLeafIn)
				}
			case strings.Contains(line, "server-ca.crt"):
				if !strings.HasSuffix(line, tc.ca) || !strings.Contains(line, "(CA)") {
					t.Errorf("after %s: %q, want the CA %s", tc.after, line, tc.ca)
				}
			}
		}
	}
	if err := check(&bytes.Buffer{}, t.TempDir(), t0); err == nil || !strings.Contains(err.Error(), "no certificates") {
		t.Errorf("an empty data dir: %v", err)
	}
}

// Rotating moves the named leaves aside; the next start issues new ones
// from the same CA. A running server (its datastore lock held) is refused.
func TestRotate(t *testing.T) {
	dataDir, cfg := serverDir(t)
	f := pki.FilesIn(cfg.Dir)
	before := map[string][]byte{}
	for _, p := range []string{f.APIServer.Cert, f.Admin.Cert, f.ServerCA.Cert} {
		before[p], _ = os.ReadFile(p)
	}
	if err := rotate(&bytes.Buffer{}, dataDir, []string{"nonsense"}, t0); err == nil || !strings.Contains(err.Error(), "want one of") {
		t.Errorf("unknown service: %v", err)
	}
	release, err := datastore.Lock(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := rotate(&bytes.Buffer{}, dataDir, nil, t0); err == nil || !strings.Contains(err.Error(), "stop kelp server first") {
		t.Errorf("rotate while the server runs: %v", err)
	}
	release()
	var out bytes.Buffer
	if err := rotate(&out, dataDir, []string{"apiserver"}, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.APIServer.Cert); !os.IsNotExist(err) || !strings.Contains(out.String(), f.APIServer.Cert) {
		t.Errorf("the apiserver certificate is still in place: %v\n%s", err, out.String())
	}
	if _, err := pki.Ensure(cfg); err != nil {
		t.Fatal(err)
	}
	for path, old := range before {
		now, _ := os.ReadFile(path)
		if changed := !bytes.Equal(old, now); changed != (path == f.APIServer.Cert) {
			t.Errorf("%s changed: %v", path, changed)
		}
	}
}

// rotate-ca runs on a stopped server, in two steps: the second rotation
// before finishing is refused, and so is a finish with nothing to finish.
func TestRotateCA(t *testing.T) {
	dataDir, cfg := serverDir(t)
	f := pki.FilesIn(cfg.Dir)
	oldCA, err := os.ReadFile(f.ServerCA.Cert)
	if err != nil {
		t.Fatal(err)
	}

	agentDir := t.TempDir()
	if err := os.MkdirAll(layout.Agent(agentDir).TLS, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		dataDir string
		path    string
		finish  bool
		want    string
	}{
		{"an agent's data dir", agentDir, "", false, "is an agent's data dir"},
		{"an empty data dir", t.TempDir(), "", false, "runs on a server"},
		{"--path that is no directory", dataDir, f.ServerCA.Cert, false, "not a directory"},
		{"--finish with --path", dataDir, t.TempDir(), true, "--finish takes no --path"},
		{"--finish before a rotation", dataDir, "", true, "no CA rotation is in progress"},
	} {
		if err := rotateCA(&bytes.Buffer{}, tc.dataDir, tc.path, tc.finish, t0); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}

	release, err := datastore.Lock(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := rotateCA(&bytes.Buffer{}, dataDir, "", false, t0); err == nil || !strings.Contains(err.Error(), "stop kelp server first") {
		t.Errorf("rotate-ca while the server runs: %v", err)
	}
	release()

	var out bytes.Buffer
	if err := rotateCA(&out, dataDir, "", false, t0); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), f.ServerCA.Cert) || !strings.Contains(out.String(), "--finish") {
		t.Errorf("rotate-ca said:\n%s", out.String())
	}
	if err := rotateCA(&bytes.Buffer{}, dataDir, "", false, t0); !errors.Is(err, pki.ErrCARotationInProgress) {
		t.Errorf("rotate-ca twice: %v", err)
	}
	out.Reset()
	if err := check(&out, dataDir, t0); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "also trusts kelp-server-ca@") {
		t.Errorf("check during the rotation:\n%s", out.String())
	}
	if err := rotateCA(&bytes.Buffer{}, dataDir, "", true, t0); err != nil {
		t.Fatal(err)
	}
	if now, _ := os.ReadFile(f.ServerCA.Cert); bytes.Contains(now, oldCA) {
		t.Error("after --finish, server-ca.crt still holds the old CA")
	}
	if err := rotateCA(&bytes.Buffer{}, dataDir, "", true, t0); !errors.Is(err, pki.ErrNoCARotation) {
		t.Errorf("--finish twice: %v", err)
	}
}
