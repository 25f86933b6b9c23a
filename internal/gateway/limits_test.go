package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// limited is a data path serving HTTP on 127.0.0.1 with limits, until
// the test ends: /backend/ to backend (host:port), any other path answered
// by a redirect. It returns the port's address.
func limited(t testing.TB, limits Limits, backend string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	svc := Backend{Weight: 1, Namespace: "app", Service: "svc", PortName: "web", Port: 80}
	cfg := Config{Ports: []Port{{Port: int32(port), Protocol: "HTTP", Hosts: []Host{{Routes: []Route{
		{Name: "app/backend", Path: PathMatch{Type: PathPrefix, Value: "/backend/"}, Backends: []Backend{svc}},
		{Name: "app/redirect", Path: PathMatch{Type: PathPrefix, Value: "/"}, Redirect: &Redirect{Hostname: "other.example", Status: 302}},
	}}}}}}
	d := testDataPath(t, cfg, backend)
	d.client = fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	d.cfg = ServeConfig{NodeName: "n1", ListenHost: "127.0.0.1", Limits: limits}
	d.transport = backendTransport(limits.orDefaults())
	d.servers = map[int32]*portServer{}
	d.listen(t.Context())
	t.Cleanup(d.closeAll)
	if len(d.failed) > 0 {
		t.Fatalf("could not listen: %v", d.failed)
	}
	return l.Addr().String()
}

// dialFrom connects to addr from the local address from (any port).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends req on c and reads the response, waiting 5 s at most.
// The body is read as far as it comes: after an error status, the data
// path may reset the connection.
func roundTrip(c net.Conn, br *bufio.Reader, req string) (*http.Response, error) {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, nil
}

const getRequest = "GET / HTTP/1.1\r\nHost: app.example\r\n\r\n"

// waitClosed says whether the data path closed c, reading what is left, in
// 5 s at most.
func waitClosed(c net.Conn, br *bufio.Reader) error {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, br)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errors.New("still open after 5 s")
	}
	return nil
}

func TestLimitsDefaults(t *testing.T) {
	d := Limits{}.orDefaults()
	if d.Header != 30*time.Second || d.Idle != 75*time.Second || d.BodyProgress != 60*time.Second || d.BackendHeader != 60*time.Second ||
		d.MaxHeaderBytes != 64<<10 || d.MaxConns != 2048 || d.MaxConnsPerSource != 256 {
		t.Errorf("defaults %+v, not those the README names", d)
	}
	if got := (Limits{Idle: time.Second, MaxConns: 3}).orDefaults(); got.Idle != time.Second || got.MaxConns != 3 || got.Header != d.Header {
		t.Errorf("limits set and the rest defaulted: %+v", got)
	}
}

// A kept-alive connection is closed once idle for Limits.Idle.
func TestLimitIdle(t *testing.T) {
	addr := limited(t, Limits{Idle: 200 * time.Millisecond}, "127.0.0.1:1")
	c := dialFrom(t, "127.0.0.1", addr)
	br := bufio.NewReader(c)
	resp, err := roundTrip(c, br, getRequest)
	if err != nil || resp.StatusCode != http.StatusFound || resp.Close {
		t.Fatalf("first request: %v, %v; want a 302 that keeps the connection", resp, err)
	}
	if err := waitClosed(c, br); err != nil {
		t.Errorf("an idle connection: %v, want it closed after 200 ms", err)
	}
}

// A request body that stops arriving for Limits.BodyProgress is cut and
// answered 408; one that arrives slowly but keeps coming is not, however
// long it takes in all.
func TestLimitSlowBody(t *testing.T) {
	received := make(chan int, 2)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		received <- int(n)
		if err != nil {
			return
		}
		fmt.Fprintf(w, "%d bytes", n)
	}))
	defer backend.Close()
	u, _ := url.Parse(backend.URL)
	addr := limited(t, Limits{BodyProgress: 300 * time.Millisecond}, u.Host)
	got := func() int {
		select {
		case n := <-received:
			return n
		case <-time.After(5 * time.Second):
			t.Fatal("the backend got no request in 5 s")
			return 0
		}
	}
	const header = "POST /backend/ HTTP/1.1\r\nHost: app.example\r\nContent-Length: 20\r\n\r\n"

	t.Run("stalled", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.1", addr)
		br := bufio.NewReader(c)
		resp, err := roundTrip(c, br, header+"0123456789")
		if n := got(); n == 20 {
			t.Error("the backend got the whole body")
		}
		if err != nil || resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("half a body, then nothing: %v, %v; want 408", resp, err)
		}
		if err := waitClosed(c, br); err != nil {
			t.Errorf("after the 408: %v, want the connection closed", err)
		}
	})

	t.Run("trickling", func(t *testing.T) {
		c := dialFrom(t, "127.0.0.1", addr)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, header); err != nil {
			t.Fatal(err)
		}
		// 2 s in all, 100 ms between two bytes.
		for range 20 {
			time.Sleep(100 * time.Millisecond)
			if _, err := io.WriteString(c, "x"); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if n := got(); n != 20 {
			t.Errorf("the backend got %d bytes, want 20", n)
		}
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("a body of 20 bytes over 2 s: %v, %v; want 200", resp, err)
		}
	})
}

// A backend that does not begin its response within Limits.BackendHeader
// is answered 502.
func TestLimitBackendHeader(t *testing.T) {
	stuck := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-stuck }))
	defer backend.Close()
	defer close(stuck)
	u, _ := url.Parse(backend.URL)
	addr := limited(t, Limits{BackendHeader: 200 * time.Millisecond}, u.Host)
	c := dialFrom(t, "127.0.0.1", addr)
	resp, err := roundTrip(c, bufio.NewReader(c), "GET /backend/ HTTP/1.1\r\nHost: app.example\r\n\r\n")
	if err != nil || resp.StatusCode != http.StatusBadGateway {
		t.Errorf("a backend that never answers: %v, %v; want 502", resp, err)
	}
}

// A header larger than Limits.MaxHeaderBytes is answered 431.
func TestLimitHeaderBytes(t *testing.T) {
	addr := limited(t, Limits{MaxHeaderBytes: 1 << 10}, "127.0.0.1:1")
	for _, tt := range []struct {
		size, code int
	}{{100, http.StatusFound}, {16 << 10, http.StatusRequestHeaderFieldsTooLarge}} {
		c := dialFrom(t, "127.0.0.1", addr)
		resp, err := roundTrip(c, bufio.NewReader(c), "GET / HTTP/1.1\r\nHost: app.example\r\nX-Big: "+strings.Repeat("x", tt.size)+"\r\n\r\n")
		if err != nil || resp.StatusCode != tt.code {
			t.Errorf("a header of %d bytes: %v, %v; want %d", tt.size, resp, err, tt.code)
		}
	}
}

// Connections over the cap of one client address are refused, closed at
// once, while another address's get through, up to the cap of the port;
// a connection closed gives its place back.
func TestLimitConns(t *testing.T) {
	addr := limited(t, Limits{MaxConns: 3, MaxConnsPerSource: 2}, "127.0.0.1:1")
	// served says whether a connection from the address is served; open
	// ones stay open until the test ends.
	served := func(from string) (net.Conn, bool) {
		c := dialFrom(t, from, addr)
		br := bufio.NewReader(c)
		resp, err := roundTrip(c, br, getRequest)
		if err == nil {
			return c, resp.StatusCode == http.StatusFound
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a connection from %s neither served nor refused in 5 s", from)
		}
		return c, false
	}
	a1, ok1 := served("127.0.0.1")
	_, ok2 := served("127.0.0.1")
	if !ok1 || !ok2 {
		t.Fatal("the first two connections from 127.0.0.1 are not served")
	}
	if _, ok := served("127.0.0.1"); ok {
		t.Error("a third connection from 127.0.0.1 is served, over the cap of 2 per address")
	}
	if _, ok := served("127.0.0.2"); !ok {
		t.Error("a connection from 127.0.0.2 is refused while 127.0.0.1 is at its cap")
	}
	if _, ok := served("127.0.0.2"); ok {
		t.Error("a fourth connection to the port is served, over its cap of 3")
	}
	a1.Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, ok := served("127.0.0.1"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a connection closed did not give its place back in 5 s")
		}
	}
}
