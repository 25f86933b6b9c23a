package component

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestGoReportsEarlyExit(t *testing.T) {
	r := Go("thing", func(context.Context) error { return errors.New("boom") })
	select {
	case err := <-r.Err():
		if err.Error() != "boom" {
			t.Errorf("error %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no error reported")
	}
	r2 := Go("quiet", func(context.Context) error { return nil })
	if err := <-r2.Err(); !strings.Contains(err.Error(), "exited unexpectedly") {
		t.Errorf("a nil return before Stop must be reported: %v", err)
	}
}

func TestStopIsIdempotentAndBounded(t *testing.T) {
	r := Go("svc", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	for range 2 {
		if err := r.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-r.Err():
		t.Fatalf("a stopped goroutine must not report failure: %v", err)
	default:
	}
	stuck := Go("stuck", func(context.Context) error { select {} })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := stuck.Stop(ctx); err == nil || !strings.Contains(err.Error(), "did not stop in time") {
		t.Errorf("got %v", err)
	}
}

func TestStopFromSeveralGoroutines(t *testing.T) {
	r := Go("svc", func(ctx context.Context) error { <-ctx.Done(); return nil })
	errc := make(chan error, 3)
	for range 3 {
		go func() { errc <- r.Stop(context.Background()) }()
	}
	for range 3 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

func TestReadyWhenGetOK(t *testing.T) {
	calls := 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls++
		if calls < 3 {
			http.Error(w, "[-]etcd failed", http.StatusInternalServerError)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	tlsConfig := srv.Client().Transport.(*http.Transport).TLSClientConfig
	r := Go("api", func(ctx context.Context) error { <-ctx.Done(); return nil }, ReadyWhen(GetOK(srv.URL, tlsConfig)))
	defer r.Stop(context.Background())
	select {
	case <-r.Ready():
	case <-time.After(5 * time.Second):
		t.Fatalf("not ready: %v", r.NotReady())
	}
	if calls != 3 {
		t.Errorf("ready after %d probes, want 3", calls)
	}

	never := Go("api", func(ctx context.Context) error { <-ctx.Done(); return nil }, ReadyWhen(GetOK(srv.URL+"/nothing", nil)))
	defer never.Stop(context.Background())
	deadline := time.Now().Add(5 * time.Second)
	for never.NotReady() == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := never.NotReady(); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("the probe's last answer must say why: %v", err)
	}
}

// GetOKWith waits for a line in the answer, not a part of one: a check
// registered later on a verbose /healthz.
func TestGetOKWith(t *testing.T) {
	var body atomic.Value
	body.Store("[+]ping ok\n[+]serviceaccount-token-controller-x ok\nhealthz check passed\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(body.Load().(string))) }))
	defer srv.Close()
	probe := GetOKWith(srv.URL, nil, "[+]serviceaccount-token-controller ok")
	if err := probe(context.Background()); err == nil {
		t.Error("ready before the line was there")
	}
	body.Store("[+]ping ok\n[+]serviceaccount-token-controller ok\nhealthz check passed\n")
	if err := probe(context.Background()); err != nil {
		t.Errorf("not ready with the line there: %v", err)
	}
}

func TestStopAfterReadyWaitsForReadiness(t *testing.T) {
	release := make(chan struct{})
	var cancelledBeforeReady bool
	ready := false
	r := Go("api", func(ctx context.Context) error {
		<-ctx.Done()
		cancelledBeforeReady = !ready
		return nil
	}, ReadyWhen(func(context.Context) error {
		select {
		case <-release:
			ready = true
			return nil
		default:
			return errors.New("starting")
		}
	}), StopAfterReady())
	go func() { time.Sleep(200 * time.Millisecond); close(release) }()
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if cancelledBeforeReady {
		t.Error("cancelled before it was ready")
	}
}
