package component

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Component is a long-running piece of kelp.
type Component interface {
	// Name names the piece in logs and errors: "kube-apiserver".
	Name() string
	// Ready is closed once the piece serves. It is never closed if the
	// piece fails or is stopped first.
	Ready() <-chan struct{}
	// Err delivers at most one error: the piece failed after it started.
	// It says what failed, not which piece: the Group adds the name.
	Err() <-chan error
	// Stop stops the piece and returns once it has, or once ctx ends. It
	// is safe to call more than once, and from several goroutines.
	Stop(ctx context.Context) error
}

// notReady is a Component that can say why it is not ready yet, for the
// error when it never becomes ready.
type notReady interface {
	NotReady() error
}

var _ Component = (*Running)(nil)

// Running is a blocking function run by Go.
type Running struct {
	*Readiness

	name   string
	opts   options
	cancel context.CancelFunc
	done   chan struct{} // closed when the function returned, after err is set
	errc   chan error
	err    error

	stopOnce sync.Once
}

// Option changes how Go runs its function.
type Option func(*options)

type options struct {
	probe          func(context.Context) error
	stopAfterReady bool
}

// ReadyWhen makes the piece ready once probe succeeds; it is polled every
// 100 ms until then. Without it, a piece is ready as soon as it runs.
func ReadyWhen(probe func(context.Context) error) Option {
	return func(o *options) { o.probe = probe }
}

// StopAfterReady makes Stop wait, within its deadline, for the piece to be
// ready before cancelling it: for a function that takes the process down
// when it is cancelled half-way through its start (the apiserver exits
// with klog.Fatal before its post-start hooks are done).
func StopAfterReady() Option {
	return func(o *options) { o.stopAfterReady = true }
}

// Go runs fn in a goroutine with a context of its own, which Stop cancels.
// If fn returns before Stop, that is a failure reported on Err.
func Go(name string, fn func(context.Context) error, opts ...Option) *Running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{name: name, cancel: cancel, done: make(chan struct{}), errc: make(chan error, 1)}
	for _, o := range opts {
		o(&r.opts)
	}
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
		r.errc <- err
	}()
	r.Readiness = PollReady(r.opts.probe, r.done)
	return r
}

// Name is the name given to Go.
func (r *Running) Name() string { return r.name }

// Err delivers the failure of a function that returned on its own.
func (r *Running) Err() <-chan error { return r.errc }

// Stop cancels the function and waits for it until ctx ends.
func (r *Running) Stop(ctx context.Context) error {
	if r.opts.stopAfterReady {
		select {
		case <-r.Ready():
		case <-r.done:
		case <-ctx.Done():
		}
	}
	r.stopOnce.Do(r.cancel)
	select {
	case <-r.done:
		if r.err != nil && !errors.Is(r.err, context.Canceled) {
			return r.err
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("did not stop in time: %w", ctx.Err())
	}
}

// GetOK is a probe for ReadyWhen: one GET of url (https with tlsConfig, or
// http) must answer 200 OK. The
// answer otherwise is part of the error, so a user sees why.
func GetOK(url string, tlsConfig *tls.Config) func(context.Context) error {
	return GetOKWith(url, tlsConfig, "")
}

// GetOKWith is GetOK whose answer must also hold line, a whole line of it
// (e.g. a check of a verbose /healthz); any line when line is "".
func GetOKWith(url string, tlsConfig *tls.Config, line string) func(context.Context) error {
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: tlsConfig, DisableKeepAlives: true},
	}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		switch {
		case resp.StatusCode != http.StatusOK:
			return fmt.Errorf("%s: %s", resp.Status, lastLines(string(body), 3))
		case line != "" && !slices.Contains(strings.Split(string(body), "\n"), line):
			return fmt.Errorf("no %q yet in the answer", line)
		}
		return nil
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}
