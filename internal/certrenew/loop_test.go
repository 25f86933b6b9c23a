package certrenew

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/pki"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestWait(t *testing.T) {
	year := pki.Expiry{RenewAt: t0.Add(245 * 24 * time.Hour), NotAfter: t0.Add(365 * 24 * time.Hour)}
	test := pki.Expiry{RenewAt: t0.Add(160 * time.Second), NotAfter: t0.Add(4 * time.Minute)}
	for _, tc := range []struct {
		name     string
		now      time.Time
		next     pki.Expiry
		failures int
		want     time.Duration
	}{
		{"a year-long leaf, fresh: an hour", t0, year, 0, time.Hour},
		{"a year-long leaf, 30 minutes before due", year.RenewAt.Add(-30 * time.Minute), year, 0, 30 * time.Minute},
		{"a test's leaf: when it is due", t0, test, 0, 160 * time.Second},
		{"nearly due: a second at least", test.RenewAt.Add(-time.Millisecond), test, 0, time.Second},
		{"due, first failure", year.RenewAt, year, 1, 5 * time.Second},
		{"due, third failure: backs off", year.RenewAt, year, 3, 20 * time.Second},
		{"due, many failures: an hour at most", year.RenewAt, year, 30, time.Hour},
		{"a test's leaf due, failing: a tenth of the time left", test.RenewAt, test, 3, 8 * time.Second},
		{"close to expiry: a second at least", test.NotAfter.Add(-time.Second), test, 1, time.Second},
		{"expired: backs off", test.NotAfter.Add(time.Minute), test, 4, 40 * time.Second},
		{"missing, never renewed", t0, pki.Expiry{}, 1, 5 * time.Second},
	} {
		if got := wait(tc.now, tc.next, tc.failures); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// The loop renews leaves as they come due, again and again, and a failed
// renewal does not stop it.
func TestLoopRenews(t *testing.T) {
	cfg := pki.Config{
		Dir: filepath.Join(t.TempDir(), "tls"), Hostname: "node-1", IPs: []net.IP{net.ParseIP("10.0.0.1")},
		ServiceIP: net.ParseIP("10.43.0.1"), ClusterDomain: "cluster.local", LeafLifetime: 3 * time.Second,
	}
	f, err := pki.Ensure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(f.APIServer.Cert)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	loop := Loop{Leaves: f.Leaves(), Renew: func(context.Context) error {
		if calls.Add(1) == 1 {
			return errors.New("disk full")
		}
		_, err := pki.Renew(cfg)
		return err
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loop.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if n := calls.Load(); n < 3 {
		t.Fatalf("renewed %d times in 10 s, want 3 (one failure, then leaves of 3 s)", n)
	}
	if now, _ := os.ReadFile(f.APIServer.Cert); bytes.Equal(now, first) {
		t.Error("the apiserver's certificate was not renewed")
	}
}
