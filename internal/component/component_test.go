package component

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestArgs(t *testing.T) {
	got := Args(map[string]string{"b": "1", "a": "x=y", "leader-elect": "true"},
		[]string{"leader-elect=false", "--v=2", "c=", "v=4"})
	want := []string{"--a=x=y", "--b=1", "--c=", "--leader-elect=false", "--v=4"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

func TestGoReportsEarlyExit(t *testing.T) {
	r := Go(context.Background(), "thing", func(context.Context) error { return errors.New("boom") })
	select {
	case err := <-r.Err():
		if !strings.Contains(err.Error(), "thing: boom") {
			t.Errorf("error %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no error reported")
	}
	r2 := Go(context.Background(), "quiet", func(context.Context) error { return nil })
	if err := <-r2.Err(); !strings.Contains(err.Error(), "exited unexpectedly") {
		t.Errorf("a nil return before Stop must be reported: %v", err)
	}
}

func TestStopIsIdempotentAndBounded(t *testing.T) {
	r := Go(context.Background(), "svc", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
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
	stuck := Go(context.Background(), "stuck", func(context.Context) error { select {} })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := stuck.Stop(ctx); err == nil || !strings.Contains(err.Error(), "did not stop in time") {
		t.Errorf("got %v", err)
	}
}

func TestWaitHTTPS(t *testing.T) {
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
	r := Go(context.Background(), "api", func(ctx context.Context) error { <-ctx.Done(); return nil })
	defer r.Stop(context.Background())
	tlsConfig := srv.Client().Transport.(*http.Transport).TLSClientConfig
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := WaitHTTPS(ctx, r, srv.URL, tlsConfig); err != nil {
		t.Fatal(err)
	}

	failing := Go(context.Background(), "api", func(context.Context) error { return errors.New("bind: address in use") })
	if err := WaitHTTPS(ctx, failing, "https://127.0.0.1:1/readyz", tlsConfig); err == nil || !strings.Contains(err.Error(), "address in use") {
		t.Errorf("a failed start must end the wait with its error: %v", err)
	}
}
