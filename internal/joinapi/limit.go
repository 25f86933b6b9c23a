package joinapi

import (
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/utils/clock"

	"github.com/kelp-dev/kelp/internal/token"
)

// Wrong tokens are counted by source and by the id of the token (its
// public part), so that one node that keeps presenting a wrong token
// behind a NAT or a load balancer, where many nodes share an address,
// does not turn the others away. A source that presents maxFailures wrong
// tokens of one id within failureWindow is refused that id without a
// check for firstBackoff, and for twice as long after each wrong token of
// it after that, up to maxBackoff; one that presents maxSourceFailures
// wrong tokens of any ids is refused whatever it presents, so a guesser
// gains nothing by making up ids. Secrets are long enough that guessing
// is hopeless (token.MinSecretLength); the limit keeps a guesser from
// costing the server its CPU (a bootstrap token is looked up in the
// apiserver) and the log its disk.
const (
	maxFailures       = 5
	maxSourceFailures = 10 * maxFailures
	failureWindow     = time.Minute
	firstBackoff      = time.Minute
	maxBackoff        = time.Hour
	// maxSources bounds the limiter's memory, some hundred bytes a source
	// and id.
	maxSources = 4096
	// summaryEvery is how often the wrong tokens not logged one by one are
	// summed up in the log.
	summaryEvery = time.Minute
	// maxLogged bounds the wrong tokens logged one by one between two
	// summaries: many addresses may guess at once.
	maxLogged = 10
)

// A limiter answers joins from a source that keeps presenting wrong
// tokens with 429 Too Many Requests, and logs the first wrong token of a
// source, then a count once a minute. Its zero value is ready to use.
type limiter struct {
	clock clock.WithDelayedExecution // nil: the real one

	mu      sync.Mutex
	sources map[key]*source
	// Since the last summary: wrong tokens logged one by one, and counted
	// for the next summary, which is due while summary is set.
	logged, wrong, refused int
	summary                clock.Timer
}

// A key is what wrong tokens are counted by: a source and a token id; the
// id "" counts every wrong token of the source.
type key struct {
	src netip.Prefix
	id  string
}

// A source is one address, or for IPv6 one /64, which a network gives a
// single machine; with a token id, its wrong tokens of that id.
type source struct {
	failures int
	first    time.Time     // of the failures counted
	until    time.Time     // refused unchecked until then
	backoff  time.Duration // the next refusal's length
}

// sourceOf is the source of a request from remoteAddr, host:port. The
// apiserver serves the join API itself, so that is the peer of the
// connection, which a client cannot choose.
func sourceOf(remoteAddr string) netip.Prefix {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return netip.Prefix{} // one source for whatever cannot be told apart
	}
	a := ap.Addr().Unmap().WithZone("")
	if a.Is4() {
		return netip.PrefixFrom(a, 32)
	}
	p, _ := a.Prefix(64)
	return p
}

// tokenID is the public part of the token in a join's header: the id of
// a bootstrap token (`kelp token create`), else "static" for the server
// and agent tokens, which have none (and whatever is not a token).
func tokenID(header string) string {
	_, secret, _ := strings.Cut(header, ":")
	if id, _, ok := strings.Cut(secret, "."); ok && token.IsBootstrap(secret) {
		return "bootstrap " + id
	}
	return "static"
}

func (l *limiter) clk() clock.WithDelayedExecution {
	if l.clock == nil {
		return clock.RealClock{}
	}
	return l.clock
}

// retryAfter says whether src is refused unchecked now with a token of
// id, and for how long.
func (l *limiter) retryAfter(src netip.Prefix, id string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk().Now()
	var wait time.Duration
	for _, k := range []key{{src, id}, {src, ""}} {
		if s, ok := l.sources[k]; ok && now.Before(s.until) {
			wait = max(wait, s.until.Sub(now))
		}
	}
	if wait == 0 {
		return 0, false
	}
	l.refused++
	l.due()
	return wait, true
}

// failed records a wrong token of id from src, whose address is from: the
// first of a source is logged as what, up to maxLogged a minute, the rest
// are counted for the summary.
func (l *limiter) failed(src netip.Prefix, id, from, what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk().Now()
	if l.count(key{src, ""}, maxSourceFailures, now) == 1 && l.logged < maxLogged {
		l.logged++
		log.WithField("from", from).Warnf("%s (further wrong tokens are counted in a summary once a minute)", what)
	} else {
		l.wrong++
	}
	l.due()
	l.count(key{src, id}, maxFailures, now)
}

// count counts a wrong token under k, which is refused once it has limit
// of them, and returns how many k has.
func (l *limiter) count(k key, limit int, now time.Time) int {
	s, ok := l.sources[k]
	if !ok || s.stale(now) {
		if !ok {
			l.makeRoom(now)
		}
		s = &source{first: now, backoff: firstBackoff}
		l.sources[k] = s
	}
	s.failures++
	if s.failures >= limit {
		s.until = now.Add(s.backoff)
		s.backoff = min(2*s.backoff, maxBackoff)
	}
	return s.failures
}

// succeeded forgets the wrong tokens of id from src: a good one came
// from it. Those of other ids stay counted, also in the source's total.
func (l *limiter) succeeded(src netip.Prefix, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.sources, key{src, id})
}

// stale: the source's wrong tokens are too old to hold against it (a
// mistake now and then is no guesser).
func (s *source) stale(now time.Time) bool {
	if s.until.IsZero() {
		return now.Sub(s.first) > failureWindow
	}
	return now.Sub(s.until) > maxBackoff
}

// makeRoom keeps the table below maxSources: it drops the stale sources,
// and when none is, the one refused for the shortest time.
func (l *limiter) makeRoom(now time.Time) {
	if l.sources == nil {
		l.sources = map[key]*source{}
	}
	if len(l.sources) < maxSources {
		return
	}
	for p, s := range l.sources {
		if s.stale(now) {
			delete(l.sources, p)
		}
	}
	if len(l.sources) < maxSources {
		return
	}
	var first key
	for p, s := range l.sources {
		if f, ok := l.sources[first]; !ok || s.until.Before(f.until) {
			first = p
		}
	}
	delete(l.sources, first)
}

// due makes sure a summary is due, which ends the minute.
func (l *limiter) due() {
	if l.summary == nil {
		l.summary = l.clk().AfterFunc(summaryEvery, l.summarize)
	}
}

// summarize logs the wrong tokens counted since the last summary, if any.
func (l *limiter) summarize() {
	l.mu.Lock()
	defer l.mu.Unlock()
	defer func() { l.logged, l.wrong, l.refused, l.summary = 0, 0, 0, nil }()
	if l.wrong == 0 && l.refused == 0 {
		return
	}
	log.WithFields(logrus.Fields{"wrongTokens": l.wrong, "refusedUnchecked": l.refused}).Warnf(
		"in the last %s: %d more wrong join tokens, and %d joins refused unchecked (%d wrong tokens of one id, or %d of any, from one address within %s make that id, or the address, wait)",
		summaryEvery, l.wrong, l.refused, maxFailures, maxSourceFailures, failureWindow)
}

// tooManyWrongTokens answers a source that is refused unchecked.
func tooManyWrongTokens(w http.ResponseWriter, wait time.Duration) {
	seconds := int((wait + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(seconds))
	http.Error(w, fmt.Sprintf("too many wrong tokens came from this address: try again in %d s with a token from `kelp token create` on a server", seconds),
		http.StatusTooManyRequests)
}
