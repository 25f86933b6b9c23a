package profiling

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func TestCheckAddress(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:6060", true},
		{"[::1]:6060", true},
		{"127.0.0.2:6060", true},
		{"0.0.0.0:6060", false},
		{"[::]:6060", false},
		{"10.0.0.1:6060", false},
	} {
		err := CheckAddress(netip.MustParseAddrPort(tc.addr))
		if (err == nil) != tc.ok {
			t.Errorf("%s: got %v", tc.addr, err)
		}
		if err != nil && !strings.Contains(err.Error(), "loopback") {
			t.Errorf("%s: the error must say why: %v", tc.addr, err)
		}
	}
}

func TestHandlerServesProfiles(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(body) == 0 {
			t.Errorf("%s: %s, %d bytes", path, resp.Status, len(body))
		}
	}
}

func TestStart(t *testing.T) {
	if _, err := Start(netip.MustParseAddrPort("0.0.0.0:6060")); err == nil || !strings.Contains(err.Error(), "--pprof-address") {
		t.Errorf("a non-loopback address must be refused, naming the flag: %v", err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort(taken.Addr().String())
	if _, err := Start(addr); err == nil || !strings.Contains(err.Error(), "--pprof-address") {
		t.Errorf("a port in use must fail at start, naming the flag: %v", err)
	}
	taken.Close()

	r, err := Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	<-r.Ready()
	resp, err := http.Get("http://" + addr.String() + "/debug/pprof/heap?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("heap profile: %s", resp.Status)
	}
	for range 2 {
		if err := r.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := http.Get("http://" + addr.String() + "/debug/pprof/"); err == nil {
		t.Error("still serving after Stop")
	}
}
