package joinapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/testlog"
	"github.com/kelp-dev/kelp/internal/token"
)

// cluster makes the CAs and serving certificate of a server, as kelp
// server does.
func cluster(t *testing.T) pki.Files {
	t.Helper()
	f, err := pki.Ensure(testPKI(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func readPEM(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// stubServer answers /cacerts with its bundle and every other path with
// handler, serving the apiserver certificate of f. It counts the requests
// that carry a token.
type stubServer struct {
	*httptest.Server
	bundle     []byte
	withToken  atomic.Int32
	cacertsHit atomic.Int32
}

func newStubServer(t *testing.T, f pki.Files, bundle []byte, handler http.HandlerFunc) *stubServer {
	t.Helper()
	s := &stubServer{bundle: bundle}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(TokenHeader) != "" {
			s.withToken.Add(1)
		}
		if r.URL.Path == CACertsPath {
			s.cacertsHit.Add(1)
			_, _ = w.Write(s.bundle)
			return
		}
		handler(w, r)
	}))
	serving, err := tls.LoadX509KeyPair(f.APIServer.Cert, f.APIServer.Key)
	if err != nil {
		t.Fatal(err)
	}
	s.TLS = &tls.Config{Certificates: []tls.Certificate{serving}}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func answerOK(w http.ResponseWriter, r *http.Request) {
	_, _ = w.Write([]byte(`{}`))
}

// firstJoin is a client that has pinned nothing yet.
func firstJoin(t *testing.T, server string, tok token.Token) Client {
	return Client{Server: server, Token: tok, CAFile: filepath.Join(t.TempDir(), "tls", "server-ca.crt")}
}

func nodeToken(hash string) token.Token {
	return token.Token{CAHash: hash, User: token.NodeUser, Secret: "agent-secret"}
}

// A machine in the middle that serves the real CA beside its own in
// /cacerts, and a serving certificate of its own CA, gets no token: not
// an agent's, and not a joining server's (whose token opens
// /v1-kelp/server-join and with it every CA key).
func TestFirstJoinSendsNoTokenToAMachineInTheMiddle(t *testing.T) {
	real, attacker := cluster(t), cluster(t)
	realCA := readPEM(t, real.ServerCA.Cert)
	bundle := append(append([]byte{}, realCA...), readPEM(t, attacker.ServerCA.Cert)...)
	fake := newStubServer(t, attacker, bundle, answerOK)
	for _, tc := range []struct {
		name string
		path string
		tok  token.Token
		req  any
	}{
		{"an agent", JoinPath, nodeToken(pki.CAHash(realCA)), JoinRequest{NodeName: "agent-1", Password: "0123456789abcdef0123"}},
		{"a joining server", ServerJoinPath, token.Token{CAHash: pki.CAHash(realCA), User: token.ServerUser, Secret: "server-secret"}, ServerJoinRequest{Name: "server-2"}},
	} {
		var resp struct{}
		_, err := firstJoin(t, fake.URL, tc.tok).Post(t.Context(), tc.path, tc.req, &resp)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "a machine between this one and the server") {
			t.Errorf("%s: %v, want a refusal that names a machine in the middle", tc.name, err)
		}
	}
	if got := fake.withToken.Load(); got != 0 {
		t.Errorf("the machine in the middle got %d requests with the token", got)
	}
}

// Whatever /cacerts answers, the token goes only to a server that the CA
// its hash names verifies, and an answer that is not that CA says what to
// check.
func TestFirstJoinCACertsAnswers(t *testing.T) {
	real, other := cluster(t), cluster(t)
	realCA, otherCA := readPEM(t, real.ServerCA.Cert), readPEM(t, other.ServerCA.Cert)
	apiserver := readPEM(t, real.APIServer.Cert)
	for _, tc := range []struct {
		name   string
		bundle []byte
		want   string // in the error; empty: joins
	}{
		{"the CA", realCA, ""},
		{"the CA and a leaf it signed", append(append([]byte{}, realCA...), apiserver...), ""},
		{"no certificate", nil, "with no CA certificate"},
		{"garbage", []byte("<html>welcome to the hotel wifi</html>"), "with no CA certificate"},
		{"one other CA", otherCA, "serves 1 certificate(s)"},
		{"three other certificates", bytes.Repeat(otherCA, 3), "serves 3 certificate(s)"},
		{"10 MB", bytes.Repeat([]byte("A"), 10<<20), "larger than 64 KiB"},
	} {
		s := newStubServer(t, real, tc.bundle, answerOK)
		var resp struct{}
		ca, err := firstJoin(t, s.URL, nodeToken(pki.CAHash(realCA))).Post(t.Context(), JoinPath, JoinRequest{}, &resp)
		if tc.want == "" {
			if err != nil || !bytes.Equal(ca, realCA) {
				t.Errorf("%s: %v; want a join that trusts the CA alone", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--server") {
			t.Errorf("%s: %v, want a refusal that says %q and what to check", tc.name, err, tc.want)
		}
		if got := s.withToken.Load(); got != 0 {
			t.Errorf("%s: the token was sent %d times", tc.name, got)
		}
	}

	// A token without a hash trusts /cacerts on first use, but not garbage.
	s := newStubServer(t, real, []byte("<html>welcome</html>"), answerOK)
	var resp struct{}
	_, err := firstJoin(t, s.URL, nodeToken("")).Post(t.Context(), JoinPath, JoinRequest{}, &resp)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "/cacerts with no PEM certificate") || !strings.Contains(err.Error(), "--server") {
		t.Errorf("garbage to a token without a hash: %v", err)
	}
}

// A join follows no redirect: Go's client would send the token header
// along to the other host.
func TestJoinFollowsNoRedirect(t *testing.T) {
	real := cluster(t)
	realCA := readPEM(t, real.ServerCA.Cert)
	// The other host holds a certificate of the same CA, so that only the
	// redirect policy keeps the token from it.
	elsewhere := newStubServer(t, real, realCA, answerOK)
	redirect := func(w http.ResponseWriter, r *http.Request) {
		to := strings.Replace(elsewhere.URL, "127.0.0.1", "localhost", 1) + r.URL.Path
		http.Redirect(w, r, to, http.StatusTemporaryRedirect)
	}
	s := newStubServer(t, real, realCA, redirect)
	pinned := filepath.Join(t.TempDir(), "server-ca.crt")
	if err := os.WriteFile(pinned, realCA, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]Client{
		"a first join":              firstJoin(t, s.URL, nodeToken(pki.CAHash(realCA))),
		"a node that pinned the CA": {Server: s.URL, Token: nodeToken(""), CAFile: pinned},
	} {
		var resp struct{}
		_, err := c.Post(t.Context(), JoinPath, JoinRequest{}, &resp)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "redirect to https://localhost:") || !strings.Contains(err.Error(), "give --server") {
			t.Errorf("%s: %v, want a refusal of the redirect", name, err)
		}
	}
	if got := elsewhere.withToken.Load(); got != 0 {
		t.Errorf("the other host got the token %d times", got)
	}

	// Nor is a redirect of /cacerts followed.
	s = newStubServer(t, real, nil, answerOK)
	s.Config.Handler = http.HandlerFunc(redirect)
	var resp struct{}
	if _, err := firstJoin(t, s.URL, nodeToken(pki.CAHash(realCA))).Post(t.Context(), JoinPath, JoinRequest{}, &resp); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "redirect") {
		t.Errorf("a redirect of /cacerts: %v, want a refusal", err)
	}
	if got := elsewhere.cacertsHit.Load(); got != 0 {
		t.Errorf("the other host was asked for its CA %d times", got)
	}
}

// During a CA rotation the served bundle is the new CA, its cross-signed
// copy and the old CA: a token that names any of them, or the bundle,
// joins, and what the join trusts still verifies the server after the
// rotation is finished.
func TestFirstJoinDuringCARotation(t *testing.T) {
	s, _ := testJoinAPI(t)
	tlsDir := filepath.Dir(s.cfg.Certs.ServerCA.Cert)
	ensure := func() {
		t.Helper()
		if _, err := pki.Ensure(testPKI(filepath.Dir(tlsDir))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pki.RotateCA(tlsDir, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	ensure() // the server's next start: leaves of the new CA
	bundle := readPEM(t, s.cfg.Certs.ServerCA.Cert)
	var certs [][]byte
	for block, rest := pem.Decode(bundle); block != nil; block, rest = pem.Decode(rest) {
		certs = append(certs, pem.EncodeToMemory(block))
	}
	if len(certs) != 3 {
		t.Fatalf("the rotation bundle holds %d certificates", len(certs))
	}
	join := func(c Client) ([]byte, error) {
		// The join API behind a TLS front with the apiserver's certificate,
		// as it runs on the apiserver's port.
		front := newStubServer(t, s.cfg.Certs, bundle, s.join)
		c.Server = front.URL
		var resp JoinResponse
		return c.Post(t.Context(), JoinPath, JoinRequest{NodeName: "agent-1", Password: "0123456789abcdef0123"}, &resp)
	}
	type result struct {
		name    string
		trusted []byte
	}
	var results []result
	for _, tc := range []struct {
		name string
		hash string
		want []byte
	}{
		{"the bundle", pki.CAHash(bundle), bundle},
		{"the old CA, third", pki.CAHash(certs[2]), bundle},
		{"the cross-signed copy, second", pki.CAHash(certs[1]), bytes.Join(certs[:2], nil)},
		{"the new CA, first", pki.CAHash(certs[0]), certs[0]},
	} {
		trusted, err := join(firstJoin(t, "", nodeToken(tc.hash)))
		if err != nil || !bytes.Equal(trusted, tc.want) {
			t.Errorf("a token that names %s: %v; trusts %d certificates, want %d", tc.name, err, bytes.Count(trusted, []byte("BEGIN")), bytes.Count(tc.want, []byte("BEGIN")))
		}
		results = append(results, result{tc.name, trusted})
	}

	if _, err := pki.FinishCARotation(tlsDir, time.Now()); err != nil {
		t.Fatal(err)
	}
	ensure()
	bundle = readPEM(t, s.cfg.Certs.ServerCA.Cert)
	for _, r := range results {
		pinned := filepath.Join(t.TempDir(), "server-ca.crt")
		if err := os.WriteFile(pinned, r.trusted, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := join(Client{Token: nodeToken(""), CAFile: pinned}); err != nil {
			t.Errorf("after --finish, a node that joined with a token that names %s: %v", r.name, err)
		}
	}
}

// A source the join API turns away gets a RetryLaterError that says for
// how long, read from the 429's Retry-After.
func TestClientReadsRetryAfter(t *testing.T) {
	s, _ := withFakeClock(t)
	testlog.Capture(t)
	front := newStubServer(t, s.cfg.Certs, readPEM(t, s.cfg.Certs.ServerCA.Cert), s.join)
	pinned := filepath.Join(t.TempDir(), "server-ca.crt")
	if err := os.WriteFile(pinned, readPEM(t, s.cfg.Certs.ServerCA.Cert), 0o600); err != nil {
		t.Fatal(err)
	}
	post := func(secret string) error {
		c := Client{Server: front.URL, Token: token.Token{User: token.NodeUser, Secret: secret}, CAFile: pinned}
		var resp JoinResponse
		_, err := c.Post(t.Context(), JoinPath, JoinRequest{NodeName: "agent-1", Password: "0123456789abcdef0123"}, &resp)
		return err
	}
	for range maxFailures {
		if err := post("guess"); !errors.Is(err, ErrRefused) {
			t.Fatalf("a wrong token: %v", err)
		}
	}
	err := post("agent-secret")
	var later *RetryLaterError
	if !errors.As(err, &later) || later.RetryAfter != firstBackoff || !strings.Contains(err.Error(), "429") || !strings.Contains(err.Error(), "too many wrong tokens") {
		t.Fatalf("the right token from a source turned away: %v, want a RetryLaterError for %s", err, firstBackoff)
	}
	if errors.Is(err, ErrRefused) {
		t.Errorf("%v is final; want it tried again later", err)
	}
}

// TestJoinDeniedByAStartingAPIServer: a server that has just started
// answers 403 to anonymous requests until its authorizer has read RBAC,
// kelp's grant of the join API included; an agent that gives up then never
// comes back after a restart of server and agent together. The join API's
// own 403 (a Node that is another's) stays final.
func TestJoinDeniedByAStartingAPIServer(t *testing.T) {
	s, _ := withFakeClock(t)
	testlog.Capture(t)
	pinned := filepath.Join(t.TempDir(), "server-ca.crt")
	if err := os.WriteFile(pinned, readPEM(t, s.cfg.Certs.ServerCA.Cert), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, contentType, body string
		final                   bool
	}{
		{"apiserver", "application/json", `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"forbidden: User \"system:anonymous\" cannot post path \"/v1-kelp/join\"","reason":"Forbidden","details":{},"code":403}`, false},
		{"join API", "text/plain; charset=utf-8", "node agent-1 belongs to another machine", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			front := newStubServer(t, s.cfg.Certs, readPEM(t, s.cfg.Certs.ServerCA.Cert), func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.contentType)
				w.WriteHeader(http.StatusForbidden)
				_, _ = w.Write([]byte(tc.body))
			})
			c := Client{Server: front.URL, Token: token.Token{User: token.NodeUser, Secret: "agent-secret"}, CAFile: pinned}
			var resp JoinResponse
			_, err := c.Post(t.Context(), JoinPath, JoinRequest{NodeName: "agent-1", Password: "0123456789abcdef0123"}, &resp)
			var later *RetryLaterError
			if got := errors.Is(err, ErrRefused); got != tc.final || errors.As(err, &later) == tc.final {
				t.Fatalf("403 from the %s: %v; want final %v", tc.name, err, tc.final)
			}
		})
	}
}

func TestRetryAfterHeader(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for header, want := range map[string]time.Duration{
		"":                              0,
		"120":                           2 * time.Minute,
		" 7 ":                           7 * time.Second,
		"-5":                            0,
		"soon":                          0,
		"Thu, 01 Jan 2026 00:00:30 GMT": 30 * time.Second,
		"Wed, 31 Dec 2025 23:00:00 GMT": 0,
	} {
		if got := retryAfter(header, now); got != want {
			t.Errorf("Retry-After %q: %s, want %s", header, got, want)
		}
	}
}

// A join waits as long as the server asks when that is longer than its
// own backoff, at most MaxRetryAfter, and stops waiting when told to.
func TestWaitHonoursRetryAfter(t *testing.T) {
	later := func(d time.Duration) error {
		return fmt.Errorf("wrapped: %w", &RetryLaterError{Server: "https://s:6443", Status: "429 Too Many Requests", Message: "slow down", RetryAfter: d})
	}
	for _, tc := range []struct {
		name  string
		err   error
		asked bool
		want  time.Duration
	}{
		{"no answer", errors.New("connection refused"), false, 4 * time.Second},
		{"429 without Retry-After", later(0), false, 4 * time.Second},
		{"429 for less than the backoff", later(time.Second), false, 4 * time.Second},
		{"429 for a minute", later(time.Minute), true, time.Minute},
		{"429 for a day", later(24 * time.Hour), true, MaxRetryAfter},
	} {
		got, asked := retryDelay(tc.err, 4*time.Second)
		if got != tc.want || (asked != nil) != tc.asked {
			t.Errorf("%s: waits %s (asked %v), want %s (asked %v)", tc.name, got, asked != nil, tc.want, tc.asked)
		}
	}

	hook := testlog.Capture(t)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	began := time.Now()
	if err := Wait(ctx, log, later(time.Hour), time.Second); !errors.Is(err, context.DeadlineExceeded) || time.Since(began) > 5*time.Second {
		t.Errorf("Wait: %v after %s, want the context's end at once", err, time.Since(began))
	}
	if len(hook.AllEntries()) != 1 || !strings.Contains(hook.LastEntry().Message, "asks this machine to wait") || !strings.Contains(hook.LastEntry().Message, "slow down") || !strings.Contains(hook.LastEntry().Message, "1h0m0s") {
		t.Errorf("logged %d entries, the last %q; want one that says the server asked to wait an hour, and why", len(hook.AllEntries()), hook.LastEntry().Message)
	}
}
