package reconcile

import "time"

// Backoff remembers the keys whose last attempt failed, so that a Sync
// that meets them on every pass tries each again only when its wait is
// over: twice as long after each failure, from First up to Max. A refused
// key (one that cannot succeed as it is) waits until it is forgotten.
//
// A Sync calls it from its own goroutine only: it takes no lock.
type Backoff[K comparable] struct {
	First, Max time.Duration
	// Now is the clock; nil is time.Now.
	Now    func() time.Time
	failed map[K]wait
}

// wait is when a key is tried again; a refused one never is.
type wait struct {
	next    time.Time
	last    time.Duration
	refused bool
}

// Due says whether key may be tried now.
func (b *Backoff[K]) Due(key K) bool {
	w, ok := b.failed[key]
	return !ok || (!w.refused && !b.now().Before(w.next))
}

// Fail holds key back for twice as long as its last wait, or First.
func (b *Backoff[K]) Fail(key K) {
	w := b.failed[key]
	w.last = min(max(2*w.last, b.First), b.Max)
	w.next = b.now().Add(w.last)
	b.set(key, w)
}

// Refuse holds key back until Forget or Keep drops it.
func (b *Backoff[K]) Refuse(key K) { b.set(key, wait{refused: true}) }

// Forget clears what key's failures left: it is due at once.
func (b *Backoff[K]) Forget(key K) { delete(b.failed, key) }

// Keep forgets every key that pending does not hold: a Sync calls it with
// the keys it still has work for, so a key that went away is not
// remembered.
func (b *Backoff[K]) Keep(pending map[K]bool) {
	for key := range b.failed {
		if !pending[key] {
			delete(b.failed, key)
		}
	}
}

// Len is how many keys are held back.
func (b *Backoff[K]) Len() int { return len(b.failed) }

func (b *Backoff[K]) set(key K, w wait) {
	if b.failed == nil {
		b.failed = map[K]wait{}
	}
	b.failed[key] = w
}

func (b *Backoff[K]) now() time.Time {
	if b.Now == nil {
		return time.Now()
	}
	return b.Now()
}
