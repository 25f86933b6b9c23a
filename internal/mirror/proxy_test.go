package mirror

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// servePeer serves h to the cluster's nodes as a node with id does.
func servePeer(t *testing.T, id Identity, h http.Handler) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, TLSConfig: id.ServerTLS()}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return netip.MustParseAddrPort(l.Addr().String())
}

func shareAll(string) bool { return true }

func TestMirror(t *testing.T) {
	ca := newTestCA(t, "client-ca")
	f := newFixture(t)
	// node-a has the image, node-b nothing, node-c does not answer, and
	// at node-d's address answers node-a, whose certificate is not
	// node-d's.
	a := servePeer(t, ca.node("node-a"), NewRegistry(f.store, shareAll))
	b := servePeer(t, ca.node("node-b"), NewRegistry(fakeStore{}, shareAll))
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := netip.MustParseAddrPort(closed.Addr().String())
	closed.Close()
	peers := []Peer{{"node-c", c}, {"node-b", b}, {"node-a", a}}
	local := ca.node("local")
	mirrorOf := func(peers []Peer) *httptest.Server {
		list := func() []Peer { return peers }
		srv := httptest.NewServer(NewMirror(list, NewTransport(local, list), shareAll))
		t.Cleanup(srv.Close)
		return srv
	}
	m := mirrorOf(peers)
	get := func(srv *httptest.Server, method, path string, header ...string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}
	const ns = "?ns=registry.example.com"

	byDigest := "/v2/app/manifests/" + f.indexD.String() + ns
	t.Run("manifest by digest from the node that has it", func(t *testing.T) {
		resp, _ := get(m, "HEAD", byDigest)
		if resp.StatusCode != 200 || resp.Header.Get("Docker-Content-Digest") != f.indexD.String() || resp.ContentLength != int64(len(f.index)) {
			t.Errorf("HEAD: %s %v", resp.Status, resp.Header)
		}
		resp, body := get(m, "GET", byDigest)
		if resp.StatusCode != 200 || string(body) != string(f.index) || resp.Header.Get("Content-Type") != "application/vnd.oci.image.index.v1+json" {
			t.Errorf("GET: %s %v %q", resp.Status, resp.Header, body)
		}
	})
	t.Run("blob, and a range answered whole", func(t *testing.T) {
		resp, body := get(m, "GET", "/v2/app/blobs/"+f.layD.String()+ns)
		if resp.StatusCode != 200 || digest.FromBytes(body) != f.layD {
			t.Errorf("GET: %s, %d bytes", resp.Status, len(body))
		}
		// A part cannot be checked against the digest: containerd skips
		// what it has of the whole.
		resp, body = get(m, "GET", "/v2/app/blobs/"+f.layD.String()+ns, "Range", "bytes=100-")
		if resp.StatusCode != 200 || string(body) != string(f.layer) {
			t.Errorf("GET of a range: %s, %d bytes", resp.Status, len(body))
		}
	})
	t.Run("nobody has it: 404 for containerd to try the registry", func(t *testing.T) {
		for _, path := range []string{"/v2/app/manifests/sha256:" + strings.Repeat("2", 64) + ns, "/v2/app/blobs/sha256:" + strings.Repeat("1", 64) + ns} {
			if resp, _ := get(m, "GET", path); resp.StatusCode != 404 {
				t.Errorf("%s: %s", path, resp.Status)
			}
		}
	})
	t.Run("no registry named", func(t *testing.T) {
		if resp, _ := get(m, "HEAD", "/v2/app/manifests/"+f.indexD.String()); resp.StatusCode != 404 {
			t.Errorf("HEAD: %s", resp.Status)
		}
	})
	t.Run("a peer that is not the node it should be is not asked", func(t *testing.T) {
		impostor := mirrorOf([]Peer{{"node-d", a}})
		if resp, _ := get(impostor, "HEAD", byDigest); resp.StatusCode != 404 {
			t.Errorf("HEAD: %s", resp.Status)
		}
	})
	t.Run("a peer of another cluster is not asked", func(t *testing.T) {
		other := newTestCA(t, "other-ca").node("node-e")
		e := servePeer(t, other, NewRegistry(f.store, shareAll))
		if resp, _ := get(mirrorOf([]Peer{{"node-e", e}}), "HEAD", byDigest); resp.StatusCode != 404 {
			t.Errorf("HEAD: %s", resp.Status)
		}
	})
	// liar is a node whose root wants the others to run its image: it
	// answers every request with its own manifest.
	var asked atomic.Int32
	liar := servePeer(t, ca.node("node-l"), liar(&asked, []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{},"layers":[]}`)))
	t.Run("a tag is never asked of the other nodes", func(t *testing.T) {
		m := mirrorOf([]Peer{{"node-l", liar}, {"node-a", a}})
		for _, method := range []string{"HEAD", "GET"} {
			if resp, body := get(m, method, "/v2/app/manifests/1.0"+ns); resp.StatusCode != 404 {
				t.Errorf("%s: %s %q", method, resp.Status, body)
			}
		}
		if n := asked.Load(); n != 0 {
			t.Errorf("the nodes were asked %d times", n)
		}
	})
	t.Run("a manifest that is not the digest asked for is dropped", func(t *testing.T) {
		m := mirrorOf([]Peer{{"node-l", liar}})
		for _, method := range []string{"HEAD", "GET"} {
			if resp, body := get(m, method, byDigest); resp.StatusCode != 404 {
				t.Errorf("%s: %s %q", method, resp.Status, body)
			}
		}
		m = mirrorOf([]Peer{{"node-l", liar}, {"node-a", a}})
		if resp, body := get(m, "GET", byDigest); resp.StatusCode != 200 || string(body) != string(f.index) {
			t.Errorf("GET beside a liar: %s %q", resp.Status, body)
		}
	})
	t.Run("a blob that is not the digest asked for never arrives whole, and its node is asked no more", func(t *testing.T) {
		m := mirrorOf([]Peer{{"node-l", liar}})
		path := "/v2/app/blobs/" + f.layD.String() + ns
		resp, err := http.Get(m.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && (resp.StatusCode != 200 || digest.FromBytes(body) != f.layD) {
			t.Fatalf("GET: %s, %d bytes of another digest, and no error", resp.Status, len(body))
		}
		before := asked.Load()
		if resp, _ := get(m, "GET", path); resp.StatusCode != 404 {
			t.Errorf("GET once the liar answered: %s", resp.Status)
		}
		if n := asked.Load() - before; n != 0 {
			t.Errorf("the liar was asked %d times more", n)
		}
	})
}

// liar answers every pull with content, whatever the digest asked for,
// and counts the requests in asked.
func liar(asked *atomic.Int32, content []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		asked.Add(1)
		_, ref, _ := cutLast(req.URL.Path, "/")
		w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
		w.Header().Set("Content-Length", strconv.Itoa(len(content)))
		w.Header().Set("Docker-Content-Digest", ref)
		if req.Method == http.MethodGet {
			_, _ = w.Write(content)
		}
	})
}

// TestPeerRefusesOutsiders: the peer endpoint serves the cluster's nodes
// only.
func TestPeerRefusesOutsiders(t *testing.T) {
	ca := newTestCA(t, "client-ca")
	f := newFixture(t)
	addr := servePeer(t, ca.node("node-a"), NewRegistry(f.store, shareAll))
	url := "https://" + addr.String() + "/v2/app/manifests/" + f.indexD.String() + "?ns=registry.example.com"
	tests := []struct {
		name string
		cert *Identity // nil: no certificate
		ok   bool
	}{
		{name: "no certificate"},
		{name: "a node's certificate of another CA", cert: &Identity{Cert: newTestCA(t, "other").issue("system:node:node-b", "system:nodes")}},
		{name: "a cluster admin", cert: &Identity{Cert: ca.issue("system:admin", "system:masters")}},
		{name: "kube-proxy", cert: &Identity{Cert: ca.issue("system:kube-proxy")}},
		{name: "system:node: without the nodes group", cert: &Identity{Cert: ca.issue("system:node:node-b")}},
		{name: "a kubelet", cert: &Identity{Cert: ca.issue("system:node:node-b", "system:nodes")}, ok: true},
		{name: "a node's controllers", cert: &Identity{Cert: ca.issue("system:kelp-controller:node-b", "system:kelp-controllers")}, ok: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &tls.Config{InsecureSkipVerify: true} // the client's trust is not what is tested
			if tt.cert != nil {
				cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return tt.cert.load() }
			}
			client := http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}
			resp, err := client.Head(url)
			if tt.ok {
				if err != nil || resp.StatusCode != 200 {
					t.Errorf("refused: %v %v", resp, err)
				}
				return
			}
			if err == nil {
				resp.Body.Close()
				t.Fatalf("served: %s", resp.Status)
			}
			if !strings.Contains(err.Error(), "certificate") {
				t.Errorf("refused for another reason: %v", err)
			}
		})
	}
}

func TestNodeOf(t *testing.T) {
	for _, tt := range []struct {
		cn     string
		groups []string
		want   string
	}{
		{"system:node:a", []string{"system:nodes"}, "a"},
		{"system:kelp-controller:b", []string{"system:kelp-controllers"}, "b"},
		{"system:kelp-controller", []string{"system:kelp-controllers"}, ""},
		{"system:node:", []string{"system:nodes"}, ""},
		{"system:node:a", []string{"system:masters"}, ""},
		{"admin", []string{"system:nodes"}, ""},
	} {
		if got, ok := NodeOf(tt.cn, tt.groups); got != tt.want || ok != (tt.want != "") {
			t.Errorf("NodeOf(%q, %q) = %q, %v; want %q", tt.cn, tt.groups, got, ok, tt.want)
		}
	}
}

// BenchmarkMirrorBlob streams a 64 MiB layer from a peer, directly (as a
// node's mirror fetches it) and through the local mirror (as containerd
// gets it), all on loopback: the ratio is the local mirror's cost.
func BenchmarkMirrorBlob(b *testing.B) {
	ca := newTestCA(b, "client-ca")
	f := newFixture(b)
	layer := make([]byte, 64<<20)
	d := f.image(b, "registry.example.com/large:1.0", layer).layer
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: NewRegistry(f.store, shareAll), TLSConfig: ca.node("node-a").ServerTLS()}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	defer srv.Close()
	peers := func() []Peer { return []Peer{{"node-a", netip.MustParseAddrPort(l.Addr().String())}} }
	transport := NewTransport(ca.node("local"), peers)
	m := httptest.NewServer(NewMirror(peers, transport, shareAll))
	defer m.Close()
	path := "/v2/app/blobs/" + d.String() + "?ns=registry.example.com"
	for _, c := range []struct {
		name   string
		client *http.Client
		url    string
	}{
		// The transport dials node-a at the address peers gives.
		{"direct", &http.Client{Transport: transport}, "https://node-a:5001" + path},
		{"through the mirror", http.DefaultClient, m.URL + path},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(layer)))
			for b.Loop() {
				resp, err := c.client.Get(c.url)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || n != int64(len(layer)) {
					b.Fatalf("%s, %d bytes", resp.Status, n)
				}
			}
		})
	}
}
