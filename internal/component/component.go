package component

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Running is a goroutine started by Go.
type Running struct {
	name    string
	cancel  context.CancelFunc
	done    chan struct{}
	errc    chan error
	stopped sync.Once
	err     error
}

// Go runs fn in a goroutine with a context of its own, derived from ctx.
// If fn returns before Stop is called, that is a failure reported on Err.
func Go(ctx context.Context, name string, fn func(context.Context) error) *Running {
	ctx, cancel := context.WithCancel(ctx)
	r := &Running{name: name, cancel: cancel, done: make(chan struct{}), errc: make(chan error, 1)}
	go func() {
		defer close(r.done)
		err := fn(ctx)
		r.err = err
		if ctx.Err() != nil {
			return // asked to stop
		}
		if err == nil {
			err = errors.New("exited unexpectedly")
		}
		r.errc <- fmt.Errorf("%s: %w", name, err)
	}()
	return r
}

// Name is the name given to Go.
func (r *Running) Name() string { return r.name }

// Err delivers the failure of a goroutine that ended on its own.
func (r *Running) Err() <-chan error { return r.errc }

// Stop cancels the goroutine and waits for it until ctx ends. It is safe to
// call more than once.
func (r *Running) Stop(ctx context.Context) error {
	r.stopped.Do(r.cancel)
	select {
	case <-r.done:
		if r.err != nil && !errors.Is(r.err, context.Canceled) {
			return fmt.Errorf("%s: %w", r.name, r.err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s did not stop in time: %w", r.name, ctx.Err())
	}
}

// WaitHTTPS polls url until it answers 200 OK, the goroutine fails, or ctx
// ends. The last answer is part of the error so a user sees why.
func WaitHTTPS(ctx context.Context, r *Running, url string, tlsConfig *tls.Config) error {
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: tlsConfig, DisableKeepAlives: true},
	}
	last := "no answer yet"
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if resp, err := client.Get(url); err != nil {
			last = err.Error()
		} else {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, lastLines(string(body), 3))
		}
		select {
		case err := <-r.errc:
			r.errc <- err // leave it for whoever watches Err
			return err
		case <-ctx.Done():
			return fmt.Errorf("%s not ready (%s): %w", r.name, last, ctx.Err())
		case <-tick.C:
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// WithLeaderElection adds kelp's leader election settings to the flags of
// the controller-manager or the scheduler. Without enabled (a datastore no
// second server can share, like SQLite) there is nobody to elect, and no
// lease to renew. Otherwise: upstream renews every 2 s, which costs most of
// an idle server's disk writes; kelp renews every 10 s and lets a standby
// take over after 60 s of silence. A restarted server does not wait that
// long: it releases the leases its previous run held.
func WithLeaderElection(flags map[string]string, enabled bool) map[string]string {
	if !enabled {
		flags["leader-elect"] = "false"
		return flags
	}
	flags["leader-elect"] = "true"
	flags["leader-elect-lease-duration"] = "60s"
	flags["leader-elect-renew-deadline"] = "40s"
	flags["leader-elect-retry-period"] = "10s"
	return flags
}

// Args renders flags for an upstream component: defaults, overridden by the
// user's "name=value" extras (a later extra wins), sorted by name.
func Args(defaults map[string]string, extra []string) []string {
	merged := make(map[string]string, len(defaults)+len(extra))
	for k, v := range defaults {
		merged[k] = v
	}
	for _, e := range extra {
		name, value, _ := strings.Cut(strings.TrimLeft(e, "-"), "=")
		merged[name] = value
	}
	names := make([]string, 0, len(merged))
	for k := range merged {
		names = append(names, k)
	}
	sort.Strings(names)
	out := make([]string, 0, len(names))
	for _, k := range names {
		out = append(out, "--"+k+"="+merged[k])
	}
	return out
}
