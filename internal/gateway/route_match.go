package gateway

import (
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// matchHost picks the host of a port whose hostname matches host most
// precisely: the same name, then the longest wildcard, then the empty
// hostname.
func matchHost(hosts []Host, host string) *Host {
	var best *Host
	bestScore := -1
	for i := range hosts {
		if s := hostScore(hosts[i].Hostname, host); s > bestScore {
			best, bestScore = &hosts[i], s
		}
	}
	return best
}

// hostScore rates how precisely pattern (a name, *.suffix, or empty for
// any) matches host: -1 not at all, higher is more precise.
func hostScore(pattern, host string) int {
	switch {
	case pattern == "":
		return 0
	case pattern == host:
		return 1 << 20
	case strings.HasPrefix(pattern, "*") && hostMatches(pattern, host):
		return len(pattern)
	}
	return -1
}

// matchRoute picks the route for r among a host's routes, which come in
// precedence order: the first of those whose hostnames match host most
// precisely.
func matchRoute(routes []Route, r *http.Request, host string, regexps *regexpCache) *Route {
	var best *Route
	bestScore := -1
	for i := range routes {
		rt := &routes[i]
		score := 0
		if len(rt.Hostnames) > 0 {
			score = -1
			for _, h := range rt.Hostnames {
				score = max(score, hostScore(h, host))
			}
			if score < 0 {
				continue
			}
		}
		if score <= bestScore || !requestMatches(rt, r, regexps) {
			continue
		}
		best, bestScore = rt, score
	}
	return best
}

func requestMatches(rt *Route, r *http.Request, regexps *regexpCache) bool {
	if !pathMatches(rt.Path, r.URL.Path, regexps) {
		return false
	}
	if rt.Method != "" && rt.Method != r.Method {
		return false
	}
	for _, h := range rt.Headers {
		v := r.Header.Values(h.Name)
		if len(v) == 0 || !valueMatches(h, strings.Join(v, ","), regexps) {
			return false
		}
	}
	if len(rt.Query) > 0 {
		q := r.URL.Query()
		for _, m := range rt.Query {
			v, ok := q[m.Name]
			if !ok || !valueMatches(m, v[0], regexps) {
				return false
			}
		}
	}
	return true
}

func valueMatches(m ValueMatch, v string, regexps *regexpCache) bool {
	if m.Regex {
		re := regexps.get(m.Value)
		return re != nil && re.MatchString(v)
	}
	return m.Value == v
}

func pathMatches(m PathMatch, path string, regexps *regexpCache) bool {
	switch m.Type {
	case PathExact:
		return path == m.Value
	case PathRegex:
		re := regexps.get("^(?:" + m.Value + ")$")
		return re != nil && re.MatchString(path)
	}
	prefix := strings.TrimSuffix(m.Value, "/")
	return prefix == "" || path == prefix || strings.HasPrefix(path, prefix+"/")
}

// replacePrefix replaces the prefix a PathPrefix match matched with repl,
// on path-element boundaries.
func replacePrefix(path, prefix, repl string) string {
	trimmed := strings.TrimSuffix(prefix, "/")
	rest := strings.TrimPrefix(path, trimmed)
	if trimmed == "" && rest == "/" {
		rest = "" // the root prefix matched nothing but itself
	}
	if rest == "" || rest == "/" {
		if repl == "" {
			return "/"
		}
		if rest == "/" && !strings.HasSuffix(repl, "/") {
			return repl + "/"
		}
		return repl
	}
	return strings.TrimSuffix(repl, "/") + rest
}

// pickBackend picks one of backends in proportion to their weights; nil
// when there is none.
func pickBackend(backends []Backend) *Backend {
	var total int64
	for _, b := range backends {
		total += int64(b.Weight)
	}
	if total <= 0 {
		return nil
	}
	n := rand.Int64N(total)
	for i := range backends {
		if n < int64(backends[i].Weight) {
			return &backends[i]
		}
		n -= int64(backends[i].Weight)
	}
	return nil
}

// regexpCache keeps the compiled regular expressions of a config.
type regexpCache struct {
	compiled map[string]*regexp.Regexp
}

// newRegexpCache compiles every regular expression of cfg once; an
// invalid one matches nothing.
func newRegexpCache(cfg Config) *regexpCache {
	c := &regexpCache{compiled: map[string]*regexp.Regexp{}}
	add := func(expr string) {
		if _, ok := c.compiled[expr]; !ok {
			re, _ := regexp.Compile(expr)
			c.compiled[expr] = re
		}
	}
	for _, p := range cfg.Ports {
		for _, h := range p.Hosts {
			for _, rt := range h.Routes {
				if rt.Path.Type == PathRegex {
					add("^(?:" + rt.Path.Value + ")$")
				}
				for _, m := range append(append([]ValueMatch(nil), rt.Headers...), rt.Query...) {
					if m.Regex {
						add(m.Value)
					}
				}
			}
		}
	}
	return c
}

func (c *regexpCache) get(expr string) *regexp.Regexp { return c.compiled[expr] }

func applyHeaders(h http.Header, f *HeaderFilter) {
	if f == nil {
		return
	}
	for _, x := range f.Set {
		h.Set(x.Name, x.Value)
	}
	// Added to what is there, in one line: "my-header: foo,bar", as the
	// spec's example has it.
	for _, x := range f.Add {
		if old := h.Values(x.Name); len(old) > 0 {
			h.Set(x.Name, strings.Join(append(slices.Clone(old), x.Value), ","))
		} else {
			h.Set(x.Name, x.Value)
		}
	}
	for _, x := range f.Remove {
		h.Del(x)
	}
}

func randN(n int) int { return rand.IntN(n) }
