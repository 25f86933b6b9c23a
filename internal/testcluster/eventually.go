package testcluster

import (
	"testing"
	"time"
)

// Eventually asks cond until it says true, and fails the test if it has
// not within a minute. Between two asks it waits as long as the last one
// took, and at least 200 ms, so that a slow cond (a kubectl) takes no
// more than half a core. An error from cond does not end the wait: it
// says why cond is not true yet, and the failure, naming what was
// awaited, ends with the last one.
func Eventually(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	EventuallyWithin(t, time.Minute, what, cond)
}

// EventuallyWithin is Eventually with another limit than a minute.
func EventuallyWithin(t testing.TB, limit time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		began := time.Now()
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("%s: not within %s: %v", what, limit, err)
			}
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(max(time.Since(began), 200*time.Millisecond))
	}
}
