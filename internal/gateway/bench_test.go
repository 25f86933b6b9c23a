package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

// BenchmarkProxy compares requests through the data path, with 100 routes
// on the host, against the same requests straight to the backend: the
// ratio of the two is the gateway's cost. Run with
// go test -run '^$' -bench Proxy ./internal/gateway/
func BenchmarkProxy(b *testing.B) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer backend.Close()
	u, _ := url.Parse(backend.URL)
	svc := Backend{Weight: 1, Namespace: "app", Service: "svc", PortName: "web", Port: 80}
	var routes []Route
	for i := range 100 {
		routes = append(routes, Route{Name: fmt.Sprintf("app/r%d", i), Hostnames: []string{"example.com"}, Path: PathMatch{Type: PathPrefix, Value: fmt.Sprintf("/r%d", i)}, Backends: []Backend{svc}})
	}
	cfg := Config{Ports: []Port{{Port: 80, Protocol: "HTTP", Hosts: []Host{{Routes: routes}}}}}
	d := testDataPath(b, cfg, u.Host)
	d.transport = &http.Transport{MaxIdleConnsPerHost: 64}
	gw := httptest.NewServer(d.handler(80, false))
	defer gw.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	run := func(b *testing.B, target string) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req, _ := http.NewRequest(http.MethodGet, target, nil)
				req.Host = "example.com"
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
	}
	b.Run("direct", func(b *testing.B) { run(b, backend.URL+"/r99/x") })
	b.Run("gateway", func(b *testing.B) { run(b, gw.URL+"/r99/x") })
}
