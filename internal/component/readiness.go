package component

import (
	"context"
	"sync"
	"time"
)

// Readiness is a probe polled until it first succeeds: the readiness of a
// piece that cannot tell on its own.
type Readiness struct {
	ready chan struct{}

	mu   sync.Mutex
	last error
}

// PollReady polls probe every 100 ms until it succeeds, which closes
// Ready, or until done is closed. A nil probe is ready at once.
func PollReady(probe func(context.Context) error, done <-chan struct{}) *Readiness {
	r := &Readiness{ready: make(chan struct{})}
	if probe == nil {
		close(r.ready)
		return r
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-done
		cancel()
	}()
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			err := probe(ctx)
			if err == nil {
				close(r.ready)
				return
			}
			r.mu.Lock()
			r.last = err
			r.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return r
}

// Ready is closed once the probe succeeded.
func (r *Readiness) Ready() <-chan struct{} { return r.ready }

// NotReady is the probe's last answer while it has not succeeded.
func (r *Readiness) NotReady() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}
