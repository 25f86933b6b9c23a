// Package notify wakes a loop that recomputes everything from informer
// caches when any of them changes. Events coalesce: a burst of changes
// (a rollout, a resync) costs the loop one pass.
package notify

import "k8s.io/client-go/tools/cache"

// Signal is a wake-up that holds at most one pending event.
type Signal struct {
	c chan struct{}
}

// New returns a signal with nothing pending.
func New() *Signal {
	return &Signal{c: make(chan struct{}, 1)}
}

// C receives once after one or more events.
func (s *Signal) C() <-chan struct{} {
	return s.c
}

// Notify records an event.
func (s *Signal) Notify() {
	select {
	case s.c <- struct{}{}:
	default:
	}
}

// Handler notifies on every add, update and delete of an informer.
func (s *Signal) Handler() cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.Notify() },
		UpdateFunc: func(any, any) { s.Notify() },
		DeleteFunc: func(any) { s.Notify() },
	}
}
