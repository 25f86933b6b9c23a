package reconcile

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	clock := time.Unix(1000, 0)
	b := Backoff[string]{First: 5 * time.Second, Max: 20 * time.Second, Now: func() time.Time { return clock }}
	if !b.Due("a") {
		t.Fatal("a key that never failed is not due")
	}

	// Each failure doubles the wait, up to Max.
	for _, wait := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 20 * time.Second} {
		b.Fail("a")
		clock = clock.Add(wait - time.Second)
		if b.Due("a") {
			t.Fatalf("due before its wait of %v", wait)
		}
		clock = clock.Add(time.Second)
		if !b.Due("a") {
			t.Fatalf("not due after its wait of %v", wait)
		}
	}
	if !b.Due("b") {
		t.Error("one key's failures hold back another")
	}

	b.Refuse("b")
	clock = clock.Add(time.Hour)
	if b.Due("b") {
		t.Error("a refused key is due")
	}

	// Keep drops what is no longer pending; Forget clears one key.
	b.Keep(map[string]bool{"a": true})
	if !b.Due("b") || b.Len() != 1 {
		t.Errorf("Keep left %d keys, b due: %v", b.Len(), b.Due("b"))
	}
	b.Fail("a")
	b.Forget("a")
	if !b.Due("a") || b.Len() != 0 {
		t.Error("Forget kept the key's wait")
	}
	b.Fail("a")
	clock = clock.Add(5*time.Second - time.Nanosecond)
	if b.Due("a") {
		t.Error("a forgotten key's next failure does not start again at First")
	}
}
