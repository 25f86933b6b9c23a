package helmchart

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/repo"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// demoArchive is a chart archive named demo of version, holding one
// ConfigMap template.
func demoArchive(t *testing.T, version string) []byte {
	t.Helper()
	ch := &chart.Chart{
		Metadata:  &chart.Metadata{APIVersion: chart.APIVersionV2, Name: "demo", Version: version},
		Templates: []*chart.File{{Name: "templates/configmap.yaml", Data: []byte("kind: ConfigMap\n")}},
		Values:    map[string]any{"greeting": "hello"},
	}
	path, err := chartutil.Save(ch, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func helmChartObject(t *testing.T, s string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	if err := json.Unmarshal([]byte(s), &obj.Object); err != nil {
		t.Fatal(err)
	}
	return obj
}

func TestLoadChartContent(t *testing.T) {
	ch, err := fetcher{}.load(context.Background(), Spec{Chart: "ignored", ChartContent: base64.StdEncoding.EncodeToString(demoArchive(t, "1.2.3"))})
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Name != "demo" || ch.Metadata.Version != "1.2.3" {
		t.Errorf("loaded %s %s", ch.Metadata.Name, ch.Metadata.Version)
	}
	for content, want := range map[string]string{
		"not base64!": "not base64",
		base64.StdEncoding.EncodeToString([]byte("not a tarball")): "not a chart archive",
	} {
		_, err := fetcher{}.load(context.Background(), Spec{ChartContent: content})
		f, ok := errors.AsType[*failure](err)
		if !ok || f.reason != ReasonChartInvalid || !f.final || !strings.Contains(err.Error(), want) {
			t.Errorf("chartContent %q: got %v, want a final ChartInvalid failure with %q", content, err, want)
		}
	}
}

// TestLoadStatic serves a static charts directory the way the apiserver
// does (behind a check of the admin's credentials) and loads a chart of it
// by its %{KUBERNETES_API}% URL.
func TestLoadStatic(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "demo.tgz"), demoArchive(t, "0.1.0"), 0o600); err != nil {
		t.Fatal(err)
	}
	static := StaticHandler(dir)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer admin" {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		static.ServeHTTP(w, r)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	api := &http.Client{Transport: bearer{srv.Client().Transport}}
	f := fetcher{apiHost: u.Host, api: api}

	ch, err := f.load(context.Background(), Spec{Chart: "http://%{KUBERNETES_API}%/static/charts/demo.tgz"})
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Version != "0.1.0" {
		t.Errorf("loaded version %s", ch.Metadata.Version)
	}
	for chartURL, want := range map[string]string{
		"http://%{KUBERNETES_API}%/static/charts/missing.tgz": "404",
		"http://%{KUBERNETES_API}%/api/v1/secrets":            "only /static/charts/",
	} {
		_, err := f.load(context.Background(), Spec{Chart: chartURL})
		if reasonOf(err) != ReasonChartUnavailable || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want ChartUnavailable with %q", chartURL, err, want)
		}
	}
}

type bearer struct{ next http.RoundTripper }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer admin")
	return b.next.RoundTrip(r)
}

func TestStaticHandler(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	for path, data := range map[string]string{
		filepath.Join(dir, "demo.tgz"):        "chart",
		filepath.Join(dir, "sub", "deep.tgz"): "deep",
		filepath.Join(outside, "secret"):      "secret",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "escape.tgz")); err != nil {
		t.Fatal(err)
	}
	h := StaticHandler(dir)
	for _, tc := range []struct {
		method, path string
		code         int
		body         string
	}{
		{http.MethodGet, "/static/charts/demo.tgz", http.StatusOK, "chart"},
		{http.MethodHead, "/static/charts/demo.tgz", http.StatusOK, ""},
		{http.MethodPost, "/static/charts/demo.tgz", http.StatusMethodNotAllowed, ""},
		{http.MethodGet, "/static/charts/", http.StatusNotFound, ""},
		{http.MethodGet, "/static/charts/sub", http.StatusNotFound, ""},
		{http.MethodGet, "/static/charts/sub/deep.tgz", http.StatusNotFound, ""},
		{http.MethodGet, "/static/charts/../charts/demo.tgz", http.StatusNotFound, ""},
		{http.MethodGet, "/static/charts/missing.tgz", http.StatusNotFound, ""},
	} {
		r := httptest.NewRequest(tc.method, "http://server"+tc.path, nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.code || (tc.body != "" && w.Body.String() != tc.body) {
			t.Errorf("%s %s: %d %q, want %d %q", tc.method, tc.path, w.Code, w.Body.String(), tc.code, tc.body)
		}
	}
	r := httptest.NewRequest(http.MethodGet, "http://server/static/charts/escape.tgz", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code == http.StatusOK {
		t.Errorf("a link out of the directory is served: %q", w.Body.String())
	}
	// The directory need not exist when the server starts.
	r = httptest.NewRequest(http.MethodGet, "http://server/static/charts/demo.tgz", nil)
	w = httptest.NewRecorder()
	StaticHandler(filepath.Join(dir, "none")).ServeHTTP(w, r)
	if w.Code != http.StatusNotFound {
		t.Errorf("missing directory: %d, want 404", w.Code)
	}
}

// TestLoadRepo looks charts up in a repository index built the way `helm
// repo index` does, with relative and absolute chart URLs.
func TestLoadRepo(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"1.0.0", "1.1.0", "2.0.0"} {
		if err := os.WriteFile(filepath.Join(dir, "demo-"+v+".tgz"), demoArchive(t, v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	index, err := repo.IndexDirectory(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := index.WriteFile(filepath.Join(dir, "index.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()
	f := fetcher{apiHost: "kelp.invalid:6443", allowLocal: true}

	for version, want := range map[string]string{"": "2.0.0", "1.0.0": "1.0.0", "~1.0": "1.0.0", "^1": "1.1.0"} {
		ch, err := f.load(context.Background(), Spec{Chart: "demo", Repo: srv.URL + "/", Version: version})
		if err != nil {
			t.Fatalf("version %q: %v", version, err)
		}
		if ch.Metadata.Version != want {
			t.Errorf("version %q: loaded %s, want %s", version, ch.Metadata.Version, want)
		}
	}
	// An archive that is not the one the index names is refused.
	if err := os.WriteFile(filepath.Join(dir, "demo-1.0.0.tgz"), demoArchive(t, "1.0.0-changed"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.load(context.Background(), Spec{Chart: "demo", Repo: srv.URL, Version: "1.0.0"}); reasonOf(err) != ReasonChartInvalid || !strings.Contains(err.Error(), "but the repository's index says") {
		t.Errorf("an archive changed after the index: got %v, want ChartInvalid naming the digest", err)
	}
	// k3s manifests may name a chart "repo/name".
	if _, err := f.load(context.Background(), Spec{Chart: "stable/demo", Repo: srv.URL}); err != nil {
		t.Errorf("repo/name: %v", err)
	}
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{Chart: "nope", Repo: srv.URL}, `chart "nope" not found`},
		{Spec{Chart: "demo", Repo: srv.URL, Version: "9.9.9"}, `version "9.9.9" not found`},
		{Spec{Chart: "demo", Repo: srv.URL + "/missing"}, "404"},
		{Spec{Chart: "demo", Repo: "http://127.0.0.1:1"}, "connection refused"},
		{Spec{Chart: "demo"}, "names no repository"},
		{Spec{Chart: "oci://registry/demo"}, "OCI"},
		{Spec{}, "spec.chart is empty"},
	} {
		_, err := f.load(context.Background(), tc.spec)
		if reasonOf(err) != ReasonChartUnavailable || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want ChartUnavailable with %q", tc.spec, err, tc.want)
		}
	}
}

func TestRepoCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	f := fetcher{apiHost: "kelp.invalid:6443", allowLocal: true}
	_, err := f.load(context.Background(), Spec{Chart: "demo", Repo: srv.URL})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("unknown CA: got %v, want a certificate error", err)
	}
	for _, s := range []Spec{
		{Chart: "demo", Repo: srv.URL, RepoCA: string(pemOf(srv))},
		{Chart: "demo", Repo: srv.URL, InsecureSkipTLSVerify: true},
	} {
		_, err := f.load(context.Background(), s)
		if err == nil || !strings.Contains(err.Error(), "404") {
			t.Errorf("trusted server: got %v, want its 404", err)
		}
	}
	_, err = f.load(context.Background(), Spec{Chart: "demo", Repo: srv.URL, RepoCA: "not PEM"})
	if err == nil || !strings.Contains(err.Error(), "spec.repoCA") {
		t.Errorf("bad repoCA: got %v", err)
	}
}

func pemOf(srv *httptest.Server) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}

// TestLocalReposRefused: without --helm-allow-local-repos, a HelmChart
// cannot make the server fetch from its own loopback or a link-local
// address (a cloud's metadata service), by address or by name.
func TestLocalReposRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	f := fetcher{apiHost: "kelp.invalid:6443"}
	for _, repoURL := range []string{
		srv.URL,
		"http://localhost:" + port,
		"http://[::1]:" + port,
		"http://169.254.169.254",
		"http://[fe80::1%25lo]:" + port,
		"http://0.0.0.0:" + port,
		"http://[fd00:ec2::254]",          // AWS's metadata service over IPv6
		"http://[64:ff9b::a9fe:a9fe]",     // 169.254.169.254 through NAT64
		"http://[::ffff:169.254.169.254]", // and as an IPv4-mapped address
		"http://100.100.100.200",          // Alibaba Cloud's metadata service
	} {
		_, err := f.load(context.Background(), Spec{Chart: "demo", Repo: repoURL})
		if err == nil || !strings.Contains(err.Error(), "which HelmCharts may not fetch from") {
			t.Errorf("%s: got %v, want a refusal", repoURL, err)
		}
	}
	// A LAN's chart server is reachable (see the README's Helm charts).
	for _, lan := range []string{"10.0.0.5:80", "192.168.1.10:8080", "172.16.0.1:443", "[fd12:3456::5]:80", "[2001:db8::1]:443"} {
		if err := refuseLocal("tcp", lan, nil); err != nil {
			t.Errorf("%s: %v, want it allowed", lan, err)
		}
	}
	_, err := fetcher{apiHost: "kelp.invalid:6443", allowLocal: true}.load(context.Background(), Spec{Chart: "demo", Repo: srv.URL})
	if err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("with allowLocal: got %v, want the server's 404", err)
	}
}
