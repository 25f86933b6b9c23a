package mirror

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestRegistry(t *testing.T) {
	f := newFixture(t)
	r := Registry{Store: f.store, Shares: func(registry string) bool { return registry == "registry.example.com" }}
	const ns = "?ns=registry.example.com"
	tests := []struct {
		name, method, path string
		header             map[string]string
		status             int
		body               []byte // nil: not checked
		want               map[string]string
	}{
		{name: "API check", method: "GET", path: "/v2/", status: 200, body: []byte("{}")},
		{name: "manifest by tag", method: "GET", path: "/v2/app/manifests/1.0" + ns, status: 200, body: f.index,
			want: map[string]string{"Content-Type": ocispec.MediaTypeImageIndex, "Docker-Content-Digest": f.indexD.String(), "Content-Length": strconv.Itoa(len(f.index))}},
		{name: "HEAD of a manifest by tag", method: "HEAD", path: "/v2/app/manifests/1.0" + ns, status: 200, body: []byte{},
			want: map[string]string{"Content-Type": ocispec.MediaTypeImageIndex, "Docker-Content-Digest": f.indexD.String(), "Content-Length": strconv.Itoa(len(f.index))}},
		{name: "manifest by digest", method: "GET", path: "/v2/app/manifests/" + f.manifestD.String() + ns, status: 200, body: f.manifest,
			want: map[string]string{"Content-Type": ocispec.MediaTypeImageManifest, "Docker-Content-Digest": f.manifestD.String()}},
		{name: "index by digest, typed by its fields", method: "GET", path: "/v2/app/manifests/" + f.indexD.String() + ns, status: 200, body: f.index,
			want: map[string]string{"Content-Type": ocispec.MediaTypeImageIndex}},
		{name: "a layer asked for as a manifest", method: "GET", path: "/v2/app/manifests/" + f.layD.String() + ns, status: 404},
		{name: "unknown tag", method: "HEAD", path: "/v2/app/manifests/2.0" + ns, status: 404},
		{name: "unknown repository", method: "GET", path: "/v2/other/manifests/1.0" + ns, status: 404},
		{name: "neither tag nor digest", method: "GET", path: "/v2/app/manifests/a:b" + ns, status: 400},
		{name: "blob", method: "GET", path: "/v2/app/blobs/" + f.layD.String() + ns, status: 200, body: f.layer,
			want: map[string]string{"Docker-Content-Digest": f.layD.String(), "Content-Length": strconv.Itoa(len(f.layer))}},
		{name: "HEAD of a blob", method: "HEAD", path: "/v2/app/blobs/" + f.layD.String() + ns, status: 200, body: []byte{},
			want: map[string]string{"Content-Length": strconv.Itoa(len(f.layer))}},
		{name: "range of a blob", method: "GET", path: "/v2/app/blobs/" + f.layD.String() + ns, header: map[string]string{"Range": "bytes=12-23"}, status: 206, body: f.layer[12:24],
			want: map[string]string{"Content-Range": "bytes 12-23/" + strconv.Itoa(len(f.layer))}},
		{name: "unknown blob", method: "GET", path: "/v2/app/blobs/sha256:" + strings.Repeat("0", 64) + ns, status: 404},
		{name: "not a digest", method: "GET", path: "/v2/app/blobs/latest" + ns, status: 400},
		{name: "registry not shared", method: "GET", path: "/v2/app/manifests/1.0?ns=docker.io", status: 404},
		{name: "no registry named", method: "GET", path: "/v2/app/blobs/" + f.layD.String(), status: 404},
		{name: "push", method: "PUT", path: "/v2/app/manifests/1.0" + ns, status: 405},
		{name: "outside the API", method: "GET", path: "/other", status: 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(tt.method, tt.path, nil)
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
			}
			if tt.body != nil && w.Body.String() != string(tt.body) {
				t.Errorf("body %.100q, want %.100q", w.Body, tt.body)
			}
			for k, v := range tt.want {
				if got := w.Header().Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestRegistryAll(t *testing.T) {
	f := newFixture(t)
	f.store.images["docker.io/library/app:1.0"] = f.store.images["registry.example.com/app:1.0"]
	r := Registry{Store: f.store, Shares: func(string) bool { return true }}
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("HEAD", "/v2/library/app/manifests/1.0?ns=docker.io", nil))
	if w.Code != http.StatusOK || w.Header().Get("Docker-Content-Digest") != f.indexD.String() {
		t.Errorf("docker.io/library/app:1.0: %d %v", w.Code, w.Header())
	}
}
