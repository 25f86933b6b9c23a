// Package reconcile is the loop every kelp controller runs: start the
// informers, wait for their caches, run Sync once, then again after each
// change and on a resync tick, until the context ends.
//
// Sync never sees events: it lists what it needs from the informers'
// listers, computes what should be, and applies what differs from what it
// applied last. So a burst of changes (a rollout, nodes joining at once)
// costs one pass, and a missed or reordered event cannot leave it wrong.
//
// A Sync that fails ends the loop with its error: the controllers program
// the node's kernel or the cluster, and one that cannot should fail where
// it is seen (kelp exits, systemd restarts it) rather than run on with
// state it could not apply. A failure that a later pass may cure (a write
// the apiserver refused, a peer not reachable yet) Sync logs instead, and
// returns nil: the next change or resync tick tries again.
package reconcile

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
)

// Loop is one controller's watch-and-reconcile loop.
type Loop struct {
	// Informers are what Sync reads, by the name errors call them
	// ("services"). Run starts them, and stops them before it returns,
	// unless Start is set.
	Informers map[string]cache.SharedIndexInformer
	// Start, if set, starts the informers instead, and Run neither runs
	// nor stops them: those of a shared cache (informer.Cache.Start)
	// outlive this loop. Run then removes its handlers before it returns.
	Start func()
	// Coalesce is how long Run waits after a change for more before it
	// syncs.
	Coalesce time.Duration
	// Resync is how often Run syncs without a change; zero is never.
	Resync time.Duration
	// Sync brings what the controller owns in line with the informers'
	// caches. resync says the pass is the Resync tick's: nothing need have
	// changed in the caches, but a controller whose work others can undo
	// (a kernel table, a route) checks that work then.
	Sync func(ctx context.Context, resync bool) error
}

// Run runs the loop until ctx ends, and returns nil then. It returns
// early with the error of a Sync that failed, or, if ctx ends before the
// informers' caches are complete, with an error naming those that are not.
// Sync runs on the goroutine that called Run, one pass at a time: a
// controller that keeps its thread in a network namespace programs that
// namespace.
func (l Loop) Run(ctx context.Context) error {
	changed := make(chan struct{}, 1) // holds at most one pending change
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	// The handler calls are what is waited for, not the informers' stores:
	// once the handler has seen the initial list, a pending change left
	// from it is one the first Sync reads anyway.
	synced := map[string]cache.InformerSynced{}
	for name, informer := range l.Informers {
		reg, err := informer.AddEventHandler(handler)
		if err != nil {
			return fmt.Errorf("watch %s: %w", name, err)
		}
		if l.Start != nil {
			defer func() { _ = informer.RemoveEventHandler(reg) }()
		}
		synced[name] = reg.HasSynced
	}

	ctx, stop := context.WithCancel(ctx)
	var informers sync.WaitGroup
	defer informers.Wait()
	defer stop()
	if l.Start != nil {
		l.Start()
	} else {
		for _, informer := range l.Informers {
			informers.Go(func() { informer.RunWithContext(ctx) })
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), slices.Collect(maps.Values(synced))...) {
		return notSynced(ctx, synced)
	}

	// An informer calls its handlers after it updated its cache, so a
	// change taken off the channel before Sync lists is in what Sync
	// lists.
	drain := func() {
		select {
		case <-changed:
		default:
		}
	}
	drain()
	var tick <-chan time.Time
	if l.Resync > 0 {
		t := time.NewTicker(l.Resync)
		defer t.Stop()
		tick = t.C
	}
	for resync := false; ; {
		if err := l.Sync(ctx, resync); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			resync = true
		case <-changed:
			resync = false
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(l.Coalesce):
			}
			drain()
		}
	}
}

// notSynced says which caches are not complete now that ctx has ended.
func notSynced(ctx context.Context, synced map[string]cache.InformerSynced) error {
	var names []string
	for name, ok := range synced {
		if !ok() {
			names = append(names, name)
		}
	}
	if names == nil {
		return nil // they completed as ctx ended
	}
	slices.Sort(names)
	return fmt.Errorf("caches of %s not synced (the apiserver may be unreachable, or refuse this client the list): %w",
		strings.Join(names, ", "), ctx.Err())
}
