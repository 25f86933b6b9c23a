package datastore

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Backend kinds, as reported in Backend.Kind.
const (
	KindSQLite       = "sqlite"
	KindEtcd         = "etcd"
	KindPostgres     = "postgres"
	KindMySQL        = "mysql"
	KindExternalEtcd = "external-etcd"
)

// endpointKind tells which backend a --datastore-endpoint selects.
func endpointKind(endpoint string) (string, error) {
	if endpoint == "" {
		return KindSQLite, nil
	}
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok {
		return "", fmt.Errorf("datastore endpoint %q has no scheme: use postgres://, mysql://, https:// (external etcd), or no endpoint for SQLite", Redact(endpoint))
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		if rest == "" {
			return "", fmt.Errorf("datastore endpoint %q names no PostgreSQL server", Redact(endpoint))
		}
		return KindPostgres, nil
	case "mysql":
		if rest == "" {
			return "", fmt.Errorf("datastore endpoint %q names no MySQL server", Redact(endpoint))
		}
		return KindMySQL, nil
	case "http", "https":
		if _, err := etcdEndpoints(endpoint); err != nil {
			return "", err
		}
		return KindExternalEtcd, nil
	default:
		return "", fmt.Errorf("unsupported datastore endpoint scheme %q in %q: use postgres://, mysql://, https:// (external etcd), or no endpoint for SQLite", scheme, Redact(endpoint))
	}
}

// etcdEndpoints splits a comma-separated list of external etcd URLs, each of
// which must be http:// or https:// with a host and nothing else.
func etcdEndpoints(endpoint string) ([]string, error) {
	var eps []string
	for _, ep := range strings.Split(endpoint, ",") {
		ep = strings.TrimSpace(ep)
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return nil, fmt.Errorf("external etcd endpoint %q in %q must look like https://host:2379: list several separated by commas", Redact(ep), Redact(endpoint))
		}
		eps = append(eps, u.Scheme+"://"+u.Host)
	}
	return eps, nil
}

var passwordParam = regexp.MustCompile(`(?i)([?&](?:ssl)?password=)[^&]*`)

// Redact returns endpoint with passwords replaced by "***", for logs and errors.
// It handles URL userinfo (postgres://user:pw@host/db), MySQL DSNs whose
// password may contain '@' or '/' (mysql://user:pw@tcp(host)/db) and
// password= query parameters. When in doubt it hides too much, never too little.
func Redact(endpoint string) string {
	var b strings.Builder
	s := endpoint
	// Without a scheme (a typo in the flag), the whole string may be a DSN.
	noScheme := !strings.Contains(s, "://")
	if noScheme {
		s = "://" + s
	}
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i+3])
		s = s[i+3:]
		seg := s
		if next := strings.Index(s, "://"); next >= 0 {
			seg = s[:next]
		}
		at := strings.LastIndex(seg, "@")
		if at < 0 {
			continue
		}
		user, _, hasPassword := strings.Cut(seg[:at], ":")
		b.WriteString(user)
		if hasPassword {
			b.WriteString(":***")
		}
		b.WriteString("@")
		s = s[at+1:]
	}
	out := b.String()
	if noScheme {
		out = strings.TrimPrefix(out, "://")
	}
	return passwordParam.ReplaceAllString(out, "${1}***")
}

// secrets returns the strings Redact hides, raw and URL-decoded, so that
// they can be scrubbed from error messages written by database drivers.
func secrets(endpoint string) []string {
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s)
		if dec, err := url.PathUnescape(s); err == nil && dec != s {
			out = append(out, dec)
		}
	}
	s := endpoint
	if !strings.Contains(s, "://") {
		s = "://" + s
	}
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			break
		}
		s = s[i+3:]
		seg := s
		if next := strings.Index(s, "://"); next >= 0 {
			seg = s[:next]
		}
		if at := strings.LastIndex(seg, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(seg[:at], ":"); ok {
				add(pw)
			}
		}
	}
	for _, m := range passwordParam.FindAllStringSubmatchIndex(endpoint, -1) {
		v := endpoint[m[3]:m[1]]
		add(v)
		if dec, err := url.QueryUnescape(v); err == nil && dec != v {
			out = append(out, dec)
		}
	}
	return out
}

// minScrubLen keeps scrub from mangling messages over a one- or two-letter
// password; those are still hidden wherever they appear as user:password@.
const minScrubLen = 3

// scrub removes the endpoint's secrets from msg.
func scrub(msg, endpoint string) string {
	if endpoint == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, endpoint, Redact(endpoint))
	for _, pw := range secrets(endpoint) {
		msg = strings.ReplaceAll(msg, ":"+pw+"@", ":***@")
		if len(pw) >= minScrubLen {
			msg = strings.ReplaceAll(msg, pw, "***")
		}
	}
	return msg
}

// redactedError is an error whose message had secrets scrubbed from it; it
// still unwraps to the original so that errors.Is and errors.As work.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// scrubError wraps err so that its message carries none of the endpoint's secrets.
func scrubError(err error, endpoint string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	clean := scrub(msg, endpoint)
	if clean == msg {
		return err
	}
	return &redactedError{msg: clean, err: err}
}
