package joinapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kelp-dev/kelp/internal/testlog"
	"github.com/kelp-dev/kelp/internal/token"
)

// withFakeClock is testJoinAPI's server with a clock the test moves.
func withFakeClock(t *testing.T) (*joinAPI, *clocktesting.FakeClock) {
	s, _ := testJoinAPI(t)
	c := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s.limit.clock = c
	return s, c
}

// joinFrom joins as agent-1 through s from the address from.
func joinFrom(s *joinAPI, from, tokenHeader string) *httptest.ResponseRecorder {
	body, _ := json.Marshal(JoinRequest{NodeName: "agent-1", NodeIPs: []string{"10.99.0.3"}, Password: "0123456789abcdef0123"})
	r := httptest.NewRequest(http.MethodPost, JoinPath, bytes.NewReader(body))
	r.RemoteAddr = from
	r.Header.Set(TokenHeader, tokenHeader)
	w := httptest.NewRecorder()
	s.join(w, r)
	return w
}

// TestJoinBackoff: after five wrong tokens within a minute, an address is
// refused without a check, even with the right token, for a minute that
// doubles with every wrong token after it; other addresses are not.
func TestJoinBackoff(t *testing.T) {
	s, c := withFakeClock(t)
	testlog.Capture(t)
	const good, wrong = "node:agent-secret", "node:guess"
	want := func(from, header string, status int, retryAfter string) {
		t.Helper()
		w := joinFrom(s, from, header)
		if w.Code != status || w.Header().Get("Retry-After") != retryAfter {
			t.Fatalf("%s from %s: %d (Retry-After %q), want %d (Retry-After %q)", header, from, w.Code, w.Header().Get("Retry-After"), status, retryAfter)
		}
	}
	for i := range maxFailures {
		want(fmt.Sprintf("192.0.2.7:%d", 40000+i), wrong, http.StatusUnauthorized, "")
		c.Step(time.Second)
	}
	// The right token would join: it is not looked at.
	// The fifth came 4 s after the first, and 1 s has passed since.
	want("192.0.2.7:41000", good, http.StatusTooManyRequests, "59")
	if w := joinFrom(s, "192.0.2.7:41000", good); !strings.Contains(w.Body.String(), "too many wrong tokens") {
		t.Errorf("429 says %q", w.Body)
	}
	want("198.51.100.9:40000", wrong, http.StatusUnauthorized, "")
	want("198.51.100.9:40000", good, http.StatusOK, "")
	c.Step(58 * time.Second)
	want("192.0.2.7:41000", good, http.StatusTooManyRequests, "1")
	c.Step(time.Second)
	want("192.0.2.7:41000", good, http.StatusOK, "")
	// The good token wiped the slate.
	want("192.0.2.7:41000", wrong, http.StatusUnauthorized, "")

	// An IPv6 /64 is one machine's.
	for i := range maxFailures {
		want(fmt.Sprintf("[2001:db8::%d]:40000", i+1), wrong, http.StatusUnauthorized, "")
	}
	want("[2001:db8::ff]:40000", good, http.StatusTooManyRequests, "60")
	want("[2001:db8:0:1::1]:40000", good, http.StatusOK, "")

	// Each wrong token after a wait doubles the next.
	c.Step(time.Minute)
	want("[2001:db8::1]:40000", wrong, http.StatusUnauthorized, "")
	want("[2001:db8::1]:40000", good, http.StatusTooManyRequests, "120")
	c.Step(2 * time.Minute)
	want("[2001:db8::1]:40000", wrong, http.StatusUnauthorized, "")
	want("[2001:db8::1]:40000", good, http.StatusTooManyRequests, "240")
}

// TestJoinSlowMistakes: wrong tokens spread over more than a minute
// never make an address wait.
func TestJoinSlowMistakes(t *testing.T) {
	s, c := withFakeClock(t)
	testlog.Capture(t)
	for range 3 * maxFailures {
		if w := joinFrom(s, "192.0.2.7:40000", "node:guess"); w.Code != http.StatusUnauthorized {
			t.Fatalf("%d %s, want 401", w.Code, w.Body)
		}
		c.Step(failureWindow / maxFailures * 2)
	}
}

func TestServerJoinBackoff(t *testing.T) {
	s, _ := withFakeClock(t)
	testlog.Capture(t)
	join := func(header string) *httptest.ResponseRecorder {
		body, _ := json.Marshal(ServerJoinRequest{Name: "server-2"})
		r := httptest.NewRequest(http.MethodPost, ServerJoinPath, bytes.NewReader(body))
		r.RemoteAddr = "192.0.2.7:40000"
		r.Header.Set(TokenHeader, header)
		w := httptest.NewRecorder()
		s.serverJoin(w, r)
		return w
	}
	for range maxFailures {
		if w := join("node:agent-secret"); w.Code != http.StatusUnauthorized {
			t.Fatalf("%d %s, want 401", w.Code, w.Body)
		}
	}
	if w := join("server:server-secret"); w.Code != http.StatusTooManyRequests {
		t.Errorf("the server token after %d wrong ones: %d %s, want 429", maxFailures, w.Code, w.Body)
	}
	// Joins from the same address count against server joins.
	if w := joinFrom(s, "192.0.2.7:40001", "node:agent-secret"); w.Code != http.StatusTooManyRequests {
		t.Errorf("a node join: %d %s, want 429", w.Code, w.Body)
	}
}

// TestWrongTokensLogged: the first wrong token of an address is logged,
// the rest are summed up once a minute.
func TestWrongTokensLogged(t *testing.T) {
	s, c := withFakeClock(t)
	hook := testlog.Capture(t)
	warnings := func() []*logrus.Entry {
		var out []*logrus.Entry
		for _, e := range hook.AllEntries() {
			if e.Level == logrus.WarnLevel {
				out = append(out, e)
			}
		}
		return out
	}
	for range 20 {
		joinFrom(s, "192.0.2.7:40000", "node:guess") // 5 wrong, 15 refused
	}
	for range 3 {
		joinFrom(s, "198.51.100.9:40000", "node:guess")
	}
	got := warnings()
	if len(got) != 2 || got[0].Data["from"] != "192.0.2.7:40000" || got[1].Data["from"] != "198.51.100.9:40000" {
		t.Fatalf("logged %d warnings, want the first wrong token of each address", len(got))
	}
	c.Step(summaryEvery - time.Second)
	if n := len(warnings()); n != 2 {
		t.Errorf("%d warnings before the minute is over, want 2", n)
	}
	c.Step(time.Second)
	got = warnings()
	if len(got) != 3 {
		t.Fatalf("%d warnings after a minute, want one summary more", len(got))
	}
	if sum := got[2]; sum.Data["wrongTokens"] != 4+2 || sum.Data["refusedUnchecked"] != 15 {
		t.Errorf("summary %q %v, want 6 wrong tokens, 15 refused", sum.Message, sum.Data)
	}
	c.Step(time.Hour)
	if n := len(warnings()); n != 3 {
		t.Errorf("%d warnings after a quiet hour, want 3", n)
	}
	joinFrom(s, "198.51.100.9:40000", "node:guess")
	c.Step(summaryEvery)
	// A wrong token an hour later is news again.
	if got := warnings(); len(got) != 4 || got[3].Data["from"] != "198.51.100.9:40000" {
		t.Errorf("after a quiet hour: %v", got[3:])
	}

	// Many addresses at once: some are logged, the rest summed up.
	for i := range 100 {
		joinFrom(s, fmt.Sprintf("10.0.0.%d:40000", i), "node:guess")
	}
	c.Step(summaryEvery)
	got = warnings()[4:]
	if len(got) != maxLogged+1 || got[maxLogged].Data["wrongTokens"] != 100-maxLogged {
		t.Errorf("100 addresses with a wrong token each: %d warnings, the last %v; want %d and a summary of %d", len(got), got[len(got)-1].Data, maxLogged+1, 100-maxLogged)
	}
}

// TestLimiterBounded: the table of sources stays below maxSources, and
// the sources refused longest stay in it.
func TestLimiterBounded(t *testing.T) {
	var l limiter
	l.clock = clocktesting.NewFakeClock(time.Now())
	testlog.Capture(t)
	blocked := netip.MustParsePrefix("203.0.113.1/32")
	for range maxFailures {
		l.failed(blocked, "static", "203.0.113.1:1", "wrong")
	}
	for i := range 2 * maxSources {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		l.failed(netip.PrefixFrom(a, 32), "static", a.String()+":1", "wrong")
	}
	if n := len(l.sources); n > maxSources {
		t.Errorf("%d sources, want at most %d", n, maxSources)
	}
	if _, ok := l.retryAfter(blocked, "static"); !ok {
		t.Error("the source that was refused got forgotten")
	}
}

func TestSourceOf(t *testing.T) {
	for remote, want := range map[string]string{
		"192.0.2.7:40000":          "192.0.2.7/32",
		"[::ffff:192.0.2.7]:40000": "192.0.2.7/32",
		"[2001:db8::1]:40000":      "2001:db8::/64",
		"[fe80::1%eth0]:40000":     "fe80::/64",
		"garbage":                  "invalid Prefix",
	} {
		if got := sourceOf(remote).String(); got != want {
			t.Errorf("sourceOf(%q) = %s, want %s", remote, got, want)
		}
	}
}

// TestJoinBackoffBehindNAT: many nodes share one address behind a NAT or
// a load balancer. One that keeps presenting a wrong token waits alone:
// a node with a token of another id joins. A guesser that tries many ids
// from one address is still made to wait, whatever id it tries next.
func TestJoinBackoffBehindNAT(t *testing.T) {
	s, _ := withFakeClock(t)
	testlog.Capture(t)
	good, err := token.CreateBootstrap(t.Context(), s.cfg.Admin, time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	const nat = "192.0.2.7:40000"
	stale := "node:abcdef.0123456789abcdef" // a token nobody made (or one deleted)
	for range maxFailures {
		if w := joinFrom(s, nat, stale); w.Code != http.StatusUnauthorized {
			t.Fatalf("a wrong token: %d %s, want 401", w.Code, w.Body)
		}
	}
	if w := joinFrom(s, nat, stale); w.Code != http.StatusTooManyRequests {
		t.Errorf("the bad node again: %d %s, want 429", w.Code, w.Body)
	}
	if w := joinFrom(s, nat, "node:"+good); w.Code != http.StatusOK {
		t.Errorf("a good node behind the same address: %d %s, want 200", w.Code, w.Body)
	}
	if w := joinFrom(s, nat, "node:agent-secret"); w.Code != http.StatusOK {
		t.Errorf("a node with the agent token behind the same address: %d %s, want 200", w.Code, w.Body)
	}

	const guesser = "203.0.113.5:40000"
	for i := range maxSourceFailures {
		w := joinFrom(s, guesser, fmt.Sprintf("node:%06d.0123456789abcdef", i))
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d %s, want 401", i, w.Code, w.Body)
		}
	}
	if w := joinFrom(s, guesser, "node:zzzzzz.0123456789abcdef"); w.Code != http.StatusTooManyRequests {
		t.Errorf("a guesser's next id: %d %s, want 429", w.Code, w.Body)
	}
}
