package addons

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

const (
	// resyncInterval is how often the directory is compared with the
	// Addons without a change seen: a missed event, an Addon deleted by
	// hand, a kind that took long to come.
	resyncInterval = 5 * time.Minute
	// quietPeriod after a change lets a file being written finish, and a
	// burst of changes cost one pass.
	quietPeriod = time.Second
)

// Run keeps the directory applied until ctx ends: within a second of a
// change, and every five minutes. Manifests that wait for a kind, or
// that the apiserver refused, are retried after 5 s and then every 10 s
// for two minutes. Start should have run first.
func (c *Controller) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch the manifests directory: %w", err)
	}
	defer w.Close()
	if err := w.Add(c.dir); err != nil {
		return fmt.Errorf("watch the manifests directory %s: %w", c.dir, err)
	}
	resync := time.NewTicker(resyncInterval)
	defer resync.Stop()
	quiet := time.NewTimer(quietPeriod)
	quiet.Stop()
	defer quiet.Stop()
	retry := newRetrier()
	defer retry.timer.Stop()
	pass := func() {
		again, err := c.sync(ctx, false)
		if err != nil && ctx.Err() == nil {
			log.WithError(err).Warn("manifests not synced; retrying")
			again = true
		}
		retry.schedule(again)
	}
	// A change between Start's pass and the watch would otherwise wait
	// for the resync.
	pass()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("the manifests directory watch ended")
			}
			if concerns(filepath.Base(ev.Name)) {
				quiet.Reset(quietPeriod)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("the manifests directory watch ended")
			}
			log.WithError(err).Warn("watch the manifests directory; changes wait for the resync")
		case <-quiet.C:
			retry.restart()
			pass()
		case <-resync.C:
			pass()
		case <-retry.timer.C:
			pass()
		}
	}
}

// concerns says whether a change to the file name may change what is
// applied: a manifest, or a .skip file.
func concerns(name string) bool {
	return isManifest(strings.TrimSuffix(name, SkipSuffix))
}

// Retries after a pass that left something to retry: after retryFirst,
// then every retryEvery, until retryFor after the first; then the resync
// retries.
const (
	retryFirst = 5 * time.Second
	retryEvery = 10 * time.Second
	retryFor   = 2 * time.Minute
)

// retrier schedules the retries of manifests that wait.
type retrier struct {
	timer *time.Timer
	first time.Time // of the retries in a row; zero: none
	now   func() time.Time
}

func newRetrier() *retrier {
	t := time.NewTimer(retryFirst)
	t.Stop()
	return &retrier{timer: t, now: time.Now}
}

// schedule arms the timer after a pass: again says that the pass left
// something to retry.
func (r *retrier) schedule(again bool) {
	if !again {
		r.restart()
		return
	}
	now := r.now()
	switch {
	case r.first.IsZero():
		r.first = now
		r.timer.Reset(retryFirst)
	case now.Sub(r.first) < retryFor:
		r.timer.Reset(retryEvery)
	default:
		r.timer.Stop()
	}
}

// restart forgets the retries so far: a change to the directory brings a
// new window of quick retries.
func (r *retrier) restart() {
	r.first = time.Time{}
	r.timer.Stop()
}
