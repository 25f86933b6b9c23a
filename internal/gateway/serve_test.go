package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// testDataPath serves cfg with the backend Service app/svc (port name web)
// at addr.
func testDataPath(t testing.TB, cfg Config, addr string) *dataPath {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	endpoints := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{serviceIndex: func(obj any) ([]string, error) {
		s := obj.(*discoveryv1.EndpointSlice)
		return []string{s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]}, nil
	}})
	if err := endpoints.Add(&discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "svc-1", Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}},
		Ports:      []discoveryv1.EndpointPort{{Name: ptr("web"), Port: ptr(int32(p))}},
		Endpoints:  []discoveryv1.Endpoint{{Addresses: []string{host}}},
	}); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	secrets := cache.NewStore(cache.MetaNamespaceKeyFunc)
	_ = secrets.Add(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: ConfigSecret}, Data: map[string][]byte{ConfigKey: data}})
	d := &dataPath{secrets: secrets, endpoints: endpoints, transport: http.DefaultTransport}
	d.load()
	return d
}

func TestHandler(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Path", r.URL.Path)
		w.Header().Set("X-Host", r.Host)
		w.Header().Set("X-Req-A", r.Header.Get("A"))
		w.Header().Set("X-Req-Gone", r.Header.Get("Gone"))
		w.Header().Set("X-Req-B", strings.Join(r.Header.Values("B"), "|"))
		w.Header().Set("Drop-Me", "1")
		_, _ = io.WriteString(w, "backend")
	}))
	defer backend.Close()
	u, _ := url.Parse(backend.URL)
	svc := Backend{Weight: 1, Namespace: "app", Service: "svc", PortName: "web", Port: 80}
	cfg := Config{Ports: []Port{{Port: 80, Protocol: "HTTP", Hosts: []Host{{Routes: []Route{
		{Name: "app/redirect", Path: PathMatch{Type: PathPrefix, Value: "/old"}, Redirect: &Redirect{Scheme: "https", Path: &PathModifier{Prefix: ptr("/new")}, Status: 301}},
		{Name: "app/redirect-port", Path: PathMatch{Type: PathPrefix, Value: "/port"}, Redirect: &Redirect{Hostname: "other.example", Port: 8443, Status: 302}},
		{Name: "app/rewrite", Path: PathMatch{Type: PathPrefix, Value: "/api"}, Rewrite: &Rewrite{Hostname: "internal", Path: &PathModifier{Prefix: ptr("/v1")}}, Backends: []Backend{svc}},
		{Name: "app/invalid", Path: PathMatch{Type: PathPrefix, Value: "/broken"}, Backends: []Backend{{Weight: 1, Invalid: true}}},
		{Name: "app/none", Path: PathMatch{Type: PathPrefix, Value: "/nobackend"}},
		{Name: "app/root", Path: PathMatch{Type: PathPrefix, Value: "/"},
			Request:  &HeaderFilter{Set: []Header{{Name: "A", Value: "set"}}, Add: []Header{{Name: "B", Value: "added"}}, Remove: []string{"Gone"}},
			Response: &HeaderFilter{Add: []Header{{Name: "X-Added", Value: "yes"}}, Remove: []string{"Drop-Me"}},
			Backends: []Backend{svc}},
	}}}}}}
	d := testDataPath(t, cfg, u.Host)
	h := d.handler(80, false)
	do := func(target string, hdr map[string]string) *http.Response {
		r := httptest.NewRequest("GET", target, nil)
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result()
	}
	for _, tt := range []struct {
		target   string
		hdr      map[string]string
		code     int
		location string
		headers  map[string]string
	}{
		{"http://example.com/old/page?x=1", nil, 301, "https://example.com/new/page?x=1", nil},
		{"http://example.com:80/port/a", nil, 302, "http://other.example:8443/port/a", nil},
		{"http://example.com/api/users", nil, 200, "", map[string]string{"X-Path": "/v1/users", "X-Host": "internal"}},
		{"http://example.com/broken", nil, 500, "", nil},
		{"http://example.com/nobackend", nil, 500, "", nil},
		{"http://example.com/x", map[string]string{"A": "client", "Gone": "1", "B": "first"}, 200, "", map[string]string{"X-Req-A": "set", "X-Req-B": "first,added", "X-Req-Gone": "", "X-Added": "yes", "Drop-Me": "", "X-Path": "/x"}},
	} {
		resp := do(tt.target, tt.hdr)
		if resp.StatusCode != tt.code {
			t.Errorf("%s: %d, want %d", tt.target, resp.StatusCode, tt.code)
			continue
		}
		if got := resp.Header.Get("Location"); got != tt.location {
			t.Errorf("%s: Location %q, want %q", tt.target, got, tt.location)
		}
		for k, v := range tt.headers {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("%s: %s = %q, want %q", tt.target, k, got, v)
			}
		}
	}
}

func TestPickBackendWeights(t *testing.T) {
	backends := []Backend{{Service: "a", Weight: 3}, {Service: "b", Weight: 1}, {Service: "zero", Weight: 0}}
	seen := map[string]int{}
	for range 4000 {
		seen[pickBackend(backends).Service]++
	}
	if seen["zero"] != 0 || seen["a"] < 2700 || seen["a"] > 3300 {
		t.Errorf("picked %v of 4000, want about 3000 a, 1000 b, no zero", seen)
	}
	if pickBackend(nil) != nil {
		t.Error("a backend out of none")
	}
}

// A port another program holds is reported on the node's Node and served
// once it is free; the other ports serve meanwhile.
func TestListenPortInUse(t *testing.T) {
	ctx := context.Background()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	heldPort, freePort := held.Addr().(*net.TCPAddr).Port, free.Addr().(*net.TCPAddr).Port
	free.Close()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	cfg := Config{Ports: []Port{{Port: int32(heldPort), Protocol: "HTTP"}, {Port: int32(freePort), Protocol: "HTTP"}}}
	d := testDataPath(t, cfg, "127.0.0.1:1")
	d.client = client
	d.cfg = ServeConfig{NodeName: "n1", ListenHost: "127.0.0.1"}
	d.servers = map[int32]*portServer{}
	defer d.closeAll()
	annotation := func() string {
		n, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Annotations[UnavailablePortsAnnotation]
	}

	d.listen(ctx)
	if got := annotation(); got != strconv.Itoa(heldPort) {
		t.Errorf("annotation %q, want the held port %d", got, heldPort)
	}
	if _, ok := d.servers[int32(freePort)]; !ok {
		t.Errorf("port %d not served while %d is held", freePort, heldPort)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", freePort))
	if err != nil {
		t.Fatalf("the free port does not answer: %v", err)
	}
	resp.Body.Close()

	held.Close()
	d.listen(ctx)
	if got := annotation(); got != "" {
		t.Errorf("annotation %q once the port is free, want none", got)
	}
	if _, ok := d.servers[int32(heldPort)]; !ok {
		t.Errorf("port %d not served once free", heldPort)
	}
}

// The certificate follows SNI, and a new config changes it for the next
// handshake.
func TestCertificateBySNI(t *testing.T) {
	certA, keyA := tlsPair(t)
	certB, keyB := tlsPair(t)
	certC, keyC := tlsPair(t)
	cfg := func(a Cert) Config {
		return Config{
			Certs: map[string]Cert{"app/a": a, "app/b": {Cert: certB, Key: keyB}},
			Ports: []Port{{Port: 443, Protocol: "HTTPS", Hosts: []Host{
				{Hostname: "a.example.com", CertID: "app/a"},
				{Hostname: "*.example.com", CertID: "app/b"},
			}}},
		}
	}
	d := testDataPath(t, cfg(Cert{Cert: certA, Key: keyA}), "127.0.0.1:1")
	get := d.certificate(443)
	leaf := func(name string) []byte {
		c, err := get(&tls.ClientHelloInfo{ServerName: name})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return c.Certificate[0]
	}
	der := func(p []byte) []byte {
		b, _ := pem.Decode(p)
		return b.Bytes
	}
	if !bytes.Equal(leaf("a.example.com"), der(certA)) || !bytes.Equal(leaf("b.example.com"), der(certB)) {
		t.Fatal("certificates not chosen by SNI")
	}
	if !bytes.Equal(leaf("other.org"), der(certA)) && !bytes.Equal(leaf("other.org"), der(certB)) {
		t.Error("no certificate for an unknown name")
	}
	data, _ := json.Marshal(cfg(Cert{Cert: certC, Key: keyC}))
	_ = d.secrets.Update(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: ConfigSecret}, Data: map[string][]byte{ConfigKey: data}})
	d.load()
	if !bytes.Equal(leaf("a.example.com"), der(certC)) {
		t.Error("the new certificate is not served after the config changed")
	}
}

// Over HTTP/2 and TLS, a request goes to the listener its connection was
// made for (SNI) or is answered 421, as the conformance test of
// GatewayHTTPSListenerDetectMisdirectedRequests has it.
func TestMisdirectedRequests(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer backend.Close()
	u, _ := url.Parse(backend.URL)
	cert, key := tlsPair(t)
	svc := []Backend{{Weight: 1, Namespace: "app", Service: "svc", PortName: "web", Port: 80}}
	host := func(name string) Host {
		h := Host{Hostname: name, CertID: "app/tls", Routes: []Route{{Name: "app/r", Path: PathMatch{Type: PathPrefix, Value: "/"}, Backends: svc}}}
		if name != "" {
			h.Routes[0].Hostnames = []string{name}
		} else {
			h.Routes[0].Hostnames = []string{"example.org"}
		}
		return h
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cfg := Config{
		Ports: []Port{{Port: int32(port), Protocol: "HTTPS", Hosts: []Host{host(""), host("second-example.org"), host("*.wildcard.org"), host("fourth-example.wildcard.org")}}},
		Certs: map[string]Cert{"app/tls": {Cert: cert, Key: key}},
	}
	d := testDataPath(t, cfg, u.Host)
	d.client = fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	d.cfg = ServeConfig{NodeName: "n1", ListenHost: "127.0.0.1"}
	d.servers = map[int32]*portServer{}
	defer d.closeAll()
	d.listen(context.Background())

	for _, tt := range []struct {
		sni, host string
		code      int
	}{
		{"example.org", "example.org", 200},
		{"example.org", "second-example.org", 421},
		{"example.org", "unknown-example.org", 404},
		{"second-example.org", "second-example.org", 200},
		{"second-example.org", "unknown-example.org", 421},
		{"third-example.wildcard.org", "fith-example.wildcard.org", 200},
		{"third-example.wildcard.org", "fourth-example.wildcard.org", 421},
		{"unknown-example.org", "example.org", 200},
	} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{ServerName: tt.sni, InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/", port), nil)
		req.Host = tt.host
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Errorf("SNI %s, host %s: %v", tt.sni, tt.host, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != tt.code || resp.ProtoMajor != 2 {
			t.Errorf("SNI %s, host %s: %d over HTTP/%d, want %d over HTTP/2", tt.sni, tt.host, resp.StatusCode, resp.ProtoMajor, tt.code)
		}
		tr.CloseIdleConnections()
	}
}

// listening is a data path of node n1 serving cfg on every address of the
// calling thread's network namespace, until the test ends.
func listening(t *testing.T, cfg Config) {
	t.Helper()
	d := testDataPath(t, cfg, "127.0.0.1:1")
	d.client = fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	d.cfg = ServeConfig{NodeName: "n1"}
	d.servers = map[int32]*portServer{}
	d.listen(t.Context())
	t.Cleanup(d.closeAll)
	if len(d.failed) > 0 {
		t.Fatalf("could not listen: %v", d.failed)
	}
}

// The data path listens on every address of the node, of both families:
// one socket on [::] that takes IPv4 too, or 0.0.0.0 where the node has no
// IPv6.
func TestListenEveryAddress(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		if err := testcluster.AddAddrs(testcluster.Loopback(t), "192.0.2.1/32", "2001:db8::1/128"); err != nil {
			t.Fatal(err)
		}
		cfg := Config{Ports: []Port{{Port: 8080, Protocol: "HTTP", Hosts: []Host{{Routes: []Route{
			{Name: "app/r", Path: PathMatch{Type: PathPrefix, Value: "/"}, Redirect: &Redirect{Hostname: "other.example", Status: 302}},
		}}}}}}
		listening(t, cfg)
		for _, host := range []string{"127.0.0.1", "192.0.2.1", "::1", "2001:db8::1"} {
			// Dialled from this thread: in the test's namespace. Right
			// after the addresses were added, the IPv6 one is now and then
			// unreachable for a moment (CI: once; here once in 600 runs).
			var c net.Conn
			var err error
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				c, err = net.DialTimeout("tcp", net.JoinHostPort(host, "8080"), 2*time.Second)
				if !errors.Is(err, syscall.ENETUNREACH) || time.Now().After(deadline) {
					break
				}
			}
			if err != nil {
				t.Errorf("%s: %v", host, err)
				continue
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: app.example\r\nConnection: close\r\n\r\n")
			status, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err != nil || !strings.HasPrefix(status, "HTTP/1.1 302") {
				t.Errorf("%s: status %q, %v; want 302", host, status, err)
			}
		}
	})
}

// localConn is a connection whose local address is local, for the TLS
// hello of a connection to it.
type localConn struct {
	net.Conn
	local net.Addr
}

func (c localConn) LocalAddr() net.Addr { return c.local }

// A connection to a Gateway's own address is served by that address's
// listeners alone; one to any other address of the node by the nodes'.
func TestDispatchByLocalAddress(t *testing.T) {
	redirect := func(to string) []Host {
		return []Host{{Routes: []Route{{Name: "app/" + to, Path: PathMatch{Type: PathPrefix, Value: "/"}, Redirect: &Redirect{Hostname: to, Status: 302}}}}}
	}
	certNodes, keyNodes := tlsPair(t)
	certGateway, keyGateway := tlsPair(t)
	cfg := Config{
		Addresses: []HeldAddress{{Address: "192.0.2.10", Node: "n1"}, {Address: "2001:db8::10", Node: "n2"}, {Address: "192.0.2.11", Node: "n1"}},
		Ports: []Port{
			{Port: 80, Protocol: "HTTP", Hosts: redirect("nodes.example")},
			{Address: "192.0.2.10", Port: 80, Protocol: "HTTP", Hosts: redirect("gw.example")},
			{Address: "2001:db8::10", Port: 80, Protocol: "HTTP", Hosts: redirect("gw6.example")},
			{Address: "192.0.2.10", Port: 8080, Protocol: "HTTP", Hosts: redirect("gw-8080.example")},
			{Address: "192.0.2.11", Port: 8080, Protocol: "HTTP", Hosts: redirect("gw11.example")},
			{Port: 443, Protocol: "HTTPS", Hosts: []Host{{CertID: "app/nodes"}}},
			{Address: "192.0.2.10", Port: 443, Protocol: "HTTPS", Hosts: []Host{{CertID: "app/gateway"}}},
		},
		Certs: map[string]Cert{"app/nodes": {Cert: certNodes, Key: keyNodes}, "app/gateway": {Cert: certGateway, Key: keyGateway}},
	}
	d := testDataPath(t, cfg, "127.0.0.1:1")
	if got := d.current.Load().protocols; len(got) != 3 || got[80] != "HTTP" || got[8080] != "HTTP" || got[443] != "HTTPS" {
		t.Errorf("listening ports %v, want 80, 8080 and 443", got)
	}
	for _, tt := range []struct {
		local    string // empty: not known
		port     int32
		location string // empty: 404
	}{
		{"", 80, "http://nodes.example/"},
		{"10.0.0.5:80", 80, "http://nodes.example/"},
		{"[fd00::5]:80", 80, "http://nodes.example/"},
		{"192.0.2.10:80", 80, "http://gw.example/"},
		{"[::ffff:192.0.2.10]:80", 80, "http://gw.example/"},
		{"[2001:db8::10]:80", 80, "http://gw6.example/"},
		{"192.0.2.10:8080", 8080, "http://gw-8080.example:8080/"},
		{"192.0.2.11:8080", 8080, "http://gw11.example:8080/"},
		// A Gateway address without listeners on the port, and the nodes'
		// addresses on a port of Gateway addresses alone.
		{"192.0.2.11:80", 80, ""},
		{"10.0.0.5:8080", 8080, ""},
	} {
		r := httptest.NewRequest("GET", "http://app.example/", nil)
		if tt.local != "" {
			r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, net.TCPAddrFromAddrPort(netip.MustParseAddrPort(tt.local))))
		}
		w := httptest.NewRecorder()
		d.handler(tt.port, false).ServeHTTP(w, r)
		got := w.Result().Header.Get("Location")
		if tt.location == "" && w.Code != http.StatusNotFound {
			t.Errorf("to %s on %d: %d %q, want 404", tt.local, tt.port, w.Code, got)
		} else if tt.location != "" && got != tt.location {
			t.Errorf("to %s on %d: %d %q, want a redirect to %s", tt.local, tt.port, w.Code, got, tt.location)
		}
	}

	der := func(p []byte) []byte {
		b, _ := pem.Decode(p)
		return b.Bytes
	}
	for _, tt := range []struct {
		local string
		want  []byte // nil: no certificate
	}{
		{"10.0.0.5:443", der(certNodes)},
		{"192.0.2.10:443", der(certGateway)},
		{"[::ffff:192.0.2.10]:443", der(certGateway)},
		{"192.0.2.11:443", nil},
		{"[2001:db8::10]:443", nil},
	} {
		hello := &tls.ClientHelloInfo{ServerName: "app.example", Conn: localConn{local: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(tt.local))}}
		c, err := d.certificate(443)(hello)
		switch {
		case tt.want == nil && err == nil:
			t.Errorf("to %s: a certificate, want none", tt.local)
		case tt.want != nil && err != nil:
			t.Errorf("to %s: %v", tt.local, err)
		case tt.want != nil && !bytes.Equal(c.Certificate[0], tt.want):
			t.Errorf("to %s: the certificate of another address", tt.local)
		}
	}
}

// Over real connections, one listener per port tells the address the
// client reached: 127.0.0.2 as a Gateway's address, 127.0.0.1 as the
// node's, over HTTP and HTTPS.
func TestDispatchListening(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		testcluster.Loopback(t)
		redirect := func(to string) []Route {
			return []Route{{Name: "app/" + to, Path: PathMatch{Type: PathPrefix, Value: "/"}, Redirect: &Redirect{Hostname: to, Status: 302}}}
		}
		certNodes, keyNodes := tlsPair(t)
		certGateway, keyGateway := tlsPair(t)
		cfg := Config{
			Addresses: []HeldAddress{{Address: "127.0.0.2", Node: "n1"}},
			Ports: []Port{
				{Port: 8080, Protocol: "HTTP", Hosts: []Host{{Routes: redirect("nodes.example")}}},
				{Address: "127.0.0.2", Port: 8080, Protocol: "HTTP", Hosts: []Host{{Routes: redirect("gw.example")}}},
				{Port: 8443, Protocol: "HTTPS", Hosts: []Host{{CertID: "app/nodes", Routes: redirect("nodes.example")}}},
				{Address: "127.0.0.2", Port: 8443, Protocol: "HTTPS", Hosts: []Host{{CertID: "app/gateway", Routes: redirect("gw.example")}}},
			},
			Certs: map[string]Cert{"app/nodes": {Cert: certNodes, Key: keyNodes}, "app/gateway": {Cert: certGateway, Key: keyGateway}},
		}
		listening(t, cfg)
		der := func(p []byte) []byte {
			b, _ := pem.Decode(p)
			return b.Bytes
		}
		for _, tt := range []struct {
			url, location string
			cert          []byte
		}{
			{"http://127.0.0.1:8080/", "http://nodes.example:8080/", nil},
			{"http://127.0.0.2:8080/", "http://gw.example:8080/", nil},
			{"https://127.0.0.1:8443/", "https://nodes.example:8443/", der(certNodes)},
			{"https://127.0.0.2:8443/", "https://gw.example:8443/", der(certGateway)},
		} {
			// Dialled from this thread, in the test's namespace: the
			// transport's own dials run on others.
			u, _ := url.Parse(tt.url)
			conn, err := net.Dial("tcp", u.Host)
			if err != nil {
				t.Fatal(err)
			}
			tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
				DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}
			req, _ := http.NewRequest(http.MethodGet, tt.url, nil)
			resp, err := tr.RoundTrip(req)
			conn.Close()
			if err != nil {
				t.Errorf("%s: %v", tt.url, err)
				continue
			}
			resp.Body.Close()
			if got := resp.Header.Get("Location"); got != tt.location {
				t.Errorf("%s: redirected to %q, want %s", tt.url, got, tt.location)
			}
			if tt.cert != nil && !bytes.Equal(resp.TLS.PeerCertificates[0].Raw, tt.cert) {
				t.Errorf("%s: the certificate of another address", tt.url)
			}
		}
	})
}
