package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/testlog"
	"github.com/kelp-dev/kelp/internal/token"
)

// joinServer is the join API as an agent sees it, on a TLS server whose
// self-signed certificate stands for the cluster's server CA.
type joinServer struct {
	*httptest.Server
	ca                []byte // PEM
	joins, caRequests atomic.Int32
}

// newJoinServer answers joins with status, and with a response when it is
// 200; caStatus is /cacerts'.
func newJoinServer(t *testing.T, status, caStatus int) *joinServer {
	t.Helper()
	return startJoinServer(t, status, caStatus, nil)
}

// startJoinServer is newJoinServer serving cert, or when it is nil,
// httptest's own certificate.
func startJoinServer(t *testing.T, status, caStatus int, cert *tls.Certificate) *joinServer {
	t.Helper()
	s := &joinServer{}
	mux := http.NewServeMux()
	mux.HandleFunc(joinapi.CACertsPath, func(w http.ResponseWriter, r *http.Request) {
		s.caRequests.Add(1)
		if caStatus != http.StatusOK {
			http.Error(w, "server CA unavailable", caStatus)
			return
		}
		_, _ = w.Write(s.ca)
	})
	mux.HandleFunc(joinapi.JoinPath, func(w http.ResponseWriter, r *http.Request) {
		s.joins.Add(1)
		if status != http.StatusOK {
			http.Error(w, "the token is not valid for this cluster", status)
			return
		}
		var req joinapi.JoinRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.Header.Get(joinapi.TokenHeader) != "node:secret" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		_ = json.NewEncoder(w).Encode(joinapi.JoinResponse{Config: joinapi.AgentConfig{ClusterCIDR: "10.42.0.0/16"}, ServerCA: s.ca})
	})
	s.Server = httptest.NewUnstartedServer(mux)
	if cert != nil {
		s.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
	}
	s.StartTLS()
	t.Cleanup(s.Close)
	s.ca = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
	return s
}

// joinFiles are where a node keeps its pinned CA and its last join.
func joinFiles(t *testing.T) (caPath, savedPath string) {
	dir := t.TempDir()
	return pki.NodeFilesIn(filepath.Join(dir, "tls")).ServerCA, filepath.Join(dir, "join.json")
}

var joinReq = joinapi.JoinRequest{NodeName: "agent-1", Password: "0123456789abcdef0123456789abcdef"}

func nodeToken(caHash string) token.Token {
	return token.Token{CAHash: caHash, User: token.NodeUser, Secret: "secret"}
}

func TestJoinPinsCAByTokenHash(t *testing.T) {
	s := newJoinServer(t, http.StatusOK, http.StatusOK)
	caPath, savedPath := joinFiles(t)
	resp, err := bootstrap(t.Context(), joinapi.Client{Server: s.URL, Token: nodeToken(pki.CAHash(s.ca)), CAFile: caPath}, joinReq, savedPath)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Config.ClusterCIDR != "10.42.0.0/16" || string(resp.ServerCA) != string(s.ca) {
		t.Errorf("joined with %+v", resp.Config)
	}
	var saved joinapi.JoinResponse
	if data, err := os.ReadFile(savedPath); err != nil || json.Unmarshal(data, &saved) != nil || !reflect.DeepEqual(saved, resp) {
		t.Errorf("saved join %+v, %v", saved.Config, err)
	}

	// Once pinned, the CA on disk is trusted and /cacerts is not asked.
	if err := os.MkdirAll(filepath.Dir(caPath), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caPath, s.ca, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := joinOnce(t.Context(), joinapi.Client{Server: s.URL, Token: nodeToken(""), CAFile: caPath}, joinReq); err != nil {
		t.Fatal(err)
	}
	if got := s.caRequests.Load(); got != 1 {
		t.Errorf("/cacerts asked %d times, want once", got)
	}
}

// A CA that does not match the token's hash is refused before the token
// is sent.
func TestJoinRefusesCAOfAnotherCluster(t *testing.T) {
	s := newJoinServer(t, http.StatusOK, http.StatusOK)
	caPath, savedPath := joinFiles(t)
	_, err := bootstrap(t.Context(), joinapi.Client{Server: s.URL, Token: nodeToken(strings.Repeat("0", 64)), CAFile: caPath}, joinReq, savedPath)
	if !errors.Is(err, joinapi.ErrRefused) || !strings.Contains(err.Error(), "does not match the token's hash") {
		t.Errorf("bootstrap: %v, want a refusal for the CA", err)
	}
	if got := s.joins.Load(); got != 0 {
		t.Errorf("the token was sent %d times to a server with another CA", got)
	}
}

// otherCluster makes the CAs and apiserver certificate of another
// cluster, as kelp server does.
func otherCluster(t *testing.T) pki.Files {
	t.Helper()
	f, err := pki.Ensure(pki.Config{Dir: filepath.Join(t.TempDir(), "tls"), Hostname: "other", ServiceIP: []byte{10, 43, 0, 1}, ClusterDomain: "cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A machine in the middle that serves the cluster's CA beside its own at
// /cacerts, and a serving certificate of its own CA, gets no token.
func TestJoinRefusesAMachineInTheMiddle(t *testing.T) {
	realCA := newJoinServer(t, http.StatusOK, http.StatusOK).ca
	attacker := otherCluster(t)
	serving, err := tls.LoadX509KeyPair(attacker.APIServer.Cert, attacker.APIServer.Key)
	if err != nil {
		t.Fatal(err)
	}
	fake := startJoinServer(t, http.StatusOK, http.StatusOK, &serving)
	attackerCA, err := os.ReadFile(attacker.ServerCA.Cert)
	if err != nil {
		t.Fatal(err)
	}
	fake.ca = append(append([]byte{}, realCA...), attackerCA...)
	caPath, savedPath := joinFiles(t)
	_, err = bootstrap(t.Context(), joinapi.Client{Server: fake.URL, Token: nodeToken(pki.CAHash(realCA)), CAFile: caPath}, joinReq, savedPath)
	if !errors.Is(err, joinapi.ErrRefused) {
		t.Errorf("bootstrap: %v, want a refusal", err)
	}
	if got := fake.joins.Load(); got != 0 {
		t.Errorf("the machine in the middle got the token %d times", got)
	}
}

// A node keeps, of the CA bundle a server serves, only what the token's
// hash vouches for: the server's own answer does not add to it.
func TestJoinKeepsOnlyThePinnedCA(t *testing.T) {
	s := newJoinServer(t, http.StatusOK, http.StatusOK)
	pinned := s.ca
	other, err := os.ReadFile(otherCluster(t).ServerCA.Cert)
	if err != nil {
		t.Fatal(err)
	}
	s.ca = append(append([]byte{}, pinned...), other...) // served and answered
	caPath, savedPath := joinFiles(t)
	resp, err := bootstrap(t.Context(), joinapi.Client{Server: s.URL, Token: nodeToken(pki.CAHash(pinned)), CAFile: caPath}, joinReq, savedPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(resp.ServerCA, pinned) {
		t.Errorf("the node keeps %d certificates as its server CA, want the pinned one alone", bytes.Count(resp.ServerCA, []byte("BEGIN CERTIFICATE")))
	}
	var saved joinapi.JoinResponse
	if data, err := os.ReadFile(savedPath); err != nil || json.Unmarshal(data, &saved) != nil || !bytes.Equal(saved.ServerCA, pinned) {
		t.Errorf("the saved join keeps another server CA than the pinned one (%v)", err)
	}
}

// A 401 is final: no retry, and no start from a saved join.
func TestJoinRefusedToken(t *testing.T) {
	s := newJoinServer(t, http.StatusUnauthorized, http.StatusOK)
	caPath, savedPath := joinFiles(t)
	if err := os.WriteFile(savedPath, []byte(`{"config":{"clusterCIDR":"10.42.0.0/16"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := bootstrap(t.Context(), joinapi.Client{Server: s.URL, Token: nodeToken(pki.CAHash(s.ca)), CAFile: caPath}, joinReq, savedPath)
	if !errors.Is(err, joinapi.ErrRefused) || !strings.Contains(err.Error(), "not valid for this cluster") {
		t.Errorf("bootstrap: %v, want the server's refusal", err)
	}
	if got := s.joins.Load(); got != 1 {
		t.Errorf("joined %d times, want once", got)
	}
}

// A node that joined before starts from its last join while the server
// does not answer.
func TestJoinFallsBackToSavedJoin(t *testing.T) {
	s := newJoinServer(t, http.StatusOK, http.StatusOK)
	ca := s.ca
	s.Close()
	want := joinapi.JoinResponse{Config: joinapi.AgentConfig{ClusterCIDR: "10.42.0.0/16", ClusterDNS: "10.43.0.10"}, ServerCA: ca}
	data, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	for _, pinned := range []bool{false, true} {
		caPath, savedPath := joinFiles(t)
		if err := os.WriteFile(savedPath, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if pinned {
			if err := os.MkdirAll(filepath.Dir(caPath), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(caPath, ca, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		got, err := bootstrap(t.Context(), joinapi.Client{Server: s.URL, Token: nodeToken(pki.CAHash(ca)), CAFile: caPath}, joinReq, savedPath)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("pinned CA %v: %+v, %v; want the saved join", pinned, got.Config, err)
		}
	}
}

// Without a saved join the node waits for the server until told to stop.
func TestJoinWaitsForServer(t *testing.T) {
	s := newJoinServer(t, http.StatusOK, http.StatusOK)
	s.Close()
	caPath, savedPath := joinFiles(t)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := bootstrap(ctx, joinapi.Client{Server: s.URL, Token: nodeToken(""), CAFile: caPath}, joinReq, savedPath)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("bootstrap: %v, want the context's end", err)
	}
}

// A server that turns this address away (429, as the join API does after
// wrong tokens came from it) is asked again no sooner than its
// Retry-After, and the log says once why the agent waits.
func TestJoinHonoursRetryAfter(t *testing.T) {
	hook := testlog.Capture(t)
	s := newJoinServer(t, http.StatusOK, http.StatusOK)
	ok := s.Config.Handler
	var turnedAway atomic.Bool
	s.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == joinapi.JoinPath && !turnedAway.Swap(true) {
			s.joins.Add(1)
			w.Header().Set("Retry-After", "3")
			http.Error(w, "too many wrong tokens came from this address", http.StatusTooManyRequests)
			return
		}
		ok.ServeHTTP(w, r)
	})
	caPath, savedPath := joinFiles(t)
	began := time.Now()
	_, err := bootstrap(t.Context(), joinapi.Client{Server: s.URL, Token: nodeToken(pki.CAHash(s.ca)), CAFile: caPath}, joinReq, savedPath)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < 3*time.Second {
		t.Errorf("joined again after %s; the server asked for 3 s", took)
	}
	if got := s.joins.Load(); got != 2 {
		t.Errorf("asked %d times, want twice", got)
	}
	var waits []string
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.WarnLevel {
			waits = append(waits, e.Message)
		}
	}
	if len(waits) != 1 || !strings.Contains(waits[0], "asks this machine to wait") || !strings.Contains(waits[0], "too many wrong tokens") || !strings.Contains(waits[0], "3s") {
		t.Errorf("warned %q; want once, why and how long it waits", waits)
	}
}

func TestFetchCAFailure(t *testing.T) {
	s := newJoinServer(t, http.StatusOK, http.StatusInternalServerError)
	caPath, _ := joinFiles(t)
	_, err := joinapi.Client{Server: s.URL, Token: nodeToken(""), CAFile: caPath}.Post(t.Context(), joinapi.JoinPath, joinReq, &joinapi.JoinResponse{})
	if err == nil || !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), "server CA unavailable") || strings.Contains(err.Error(), "nil") {
		t.Errorf("fetch the CA: %v, want the status and the server's message", err)
	}
}

// A power cut can leave the node password file empty or cut short; it is
// then made again, with a warning, rather than sent and refused forever.
func TestNodePassword(t *testing.T) {
	const kept = "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name    string
		content *string
		keep    bool
	}{
		{name: "missing"},
		{name: "empty", content: ptr("")},
		{name: "short", content: ptr("0123456\n")},
		{name: "kept", content: ptr(kept + "\n"), keep: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hook := testlog.Capture(t)
			path := filepath.Join(t.TempDir(), "node-password")
			if tc.content != nil {
				if err := os.WriteFile(path, []byte(*tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := nodePassword(path)
			if err != nil {
				t.Fatal(err)
			}
			if tc.keep && got != kept || !tc.keep && (got == kept || len(got) < joinapi.MinPasswordLength) {
				t.Errorf("password %q", got)
			}
			if data, _ := os.ReadFile(path); strings.TrimSpace(string(data)) != got {
				t.Errorf("file holds %q, want %q", data, got)
			}
			warned := false
			for _, e := range hook.AllEntries() {
				warned = warned || e.Level == logrus.WarnLevel && e.Data["file"] == path
			}
			if want := tc.content != nil && !tc.keep; warned != want {
				t.Errorf("warned %v, want %v", warned, want)
			}
		})
	}
}

func ptr(s string) *string { return &s }
