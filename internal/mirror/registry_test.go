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
	// The node holds an image of docker.io, which it does not share, and
	// content of no image.
	secret := f.image(t, "docker.io/library/secret:1.0", []byte("secret layer"))
	loose := f.add([]byte("loose content"))
	r := NewRegistry(f.store, func(registry string) bool { return registry == "registry.example.com" })
	const ns = "?ns=registry.example.com"
	tests := []struct {
		name, method, path string
		header             map[string]string
		status             int
		body               []byte // nil: not checked
		want               map[string]string
	}{
		{name: "API check", method: "GET", path: "/v2/", status: 200, body: []byte("{}")},
		{name: "a tag is the registry's to resolve, never a node's", method: "GET", path: "/v2/app/manifests/1.0" + ns, status: 404},
		{name: "HEAD of a tag", method: "HEAD", path: "/v2/app/manifests/1.0" + ns, status: 404},
		{name: "manifest by digest", method: "GET", path: "/v2/app/manifests/" + f.manifestD.String() + ns, status: 200, body: f.manifest,
			want: map[string]string{"Content-Type": ocispec.MediaTypeImageManifest, "Docker-Content-Digest": f.manifestD.String()}},
		{name: "index by digest, typed by its fields", method: "GET", path: "/v2/app/manifests/" + f.indexD.String() + ns, status: 200, body: f.index,
			want: map[string]string{"Content-Type": ocispec.MediaTypeImageIndex}},
		{name: "a layer asked for as a manifest", method: "GET", path: "/v2/app/manifests/" + f.layD.String() + ns, status: 404},
		{name: "neither tag nor digest", method: "GET", path: "/v2/app/manifests/a:b" + ns, status: 404},
		{name: "blob", method: "GET", path: "/v2/app/blobs/" + f.layD.String() + ns, status: 200, body: f.layer,
			want: map[string]string{"Docker-Content-Digest": f.layD.String(), "Content-Length": strconv.Itoa(len(f.layer))}},
		{name: "HEAD of a blob", method: "HEAD", path: "/v2/app/blobs/" + f.layD.String() + ns, status: 200, body: []byte{},
			want: map[string]string{"Content-Length": strconv.Itoa(len(f.layer))}},
		{name: "range of a blob", method: "GET", path: "/v2/app/blobs/" + f.layD.String() + ns, header: map[string]string{"Range": "bytes=12-23"}, status: 206, body: f.layer[12:24],
			want: map[string]string{"Content-Range": "bytes 12-23/" + strconv.Itoa(len(f.layer))}},
		{name: "unknown blob", method: "GET", path: "/v2/app/blobs/sha256:" + strings.Repeat("0", 64) + ns, status: 404},
		{name: "not a digest", method: "GET", path: "/v2/app/blobs/latest" + ns, status: 400},
		{name: "registry not shared", method: "GET", path: "/v2/app/manifests/" + f.indexD.String() + "?ns=docker.io", status: 404},
		{name: "a layer of an image of a registry not shared", method: "GET", path: "/v2/app/blobs/" + secret.layer.String() + ns, status: 404},
		{name: "HEAD of a layer of an image of a registry not shared", method: "HEAD", path: "/v2/app/blobs/" + secret.layer.String() + ns, status: 404},
		{name: "a manifest of an image of a registry not shared", method: "GET", path: "/v2/app/manifests/" + secret.manifest.String() + ns, status: 404},
		{name: "content of no image", method: "GET", path: "/v2/app/blobs/" + loose.String() + ns, status: 404},
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

// TestRegistryAll: a node that shares every registry serves the content
// of the images of each, under that registry's name only.
func TestRegistryAll(t *testing.T) {
	f := newFixture(t)
	f.store.images["docker.io/library/app:1.0"] = f.store.images["registry.example.com/app:1.0"]
	other := f.image(t, "ghcr.io/other/app:2.0", []byte("ghcr.io layer"))
	// containerd's CRI also names an image by its ID, which names no
	// registry.
	byID := f.image(t, "sha256:"+strings.Repeat("a", 64), []byte("layer of an image named by its ID"))
	r := NewRegistry(f.store, shareAll)
	for _, tt := range []struct {
		path   string
		status int
	}{
		{"/v2/library/app/manifests/" + f.indexD.String() + "?ns=docker.io", http.StatusOK},
		{"/v2/library/app/blobs/" + f.layD.String() + "?ns=docker.io", http.StatusOK},
		{"/v2/other/app/blobs/" + other.layer.String() + "?ns=ghcr.io", http.StatusOK},
		{"/v2/library/app/blobs/" + other.layer.String() + "?ns=docker.io", http.StatusNotFound},
		{"/v2/library/app/blobs/" + byID.layer.String() + "?ns=docker.io", http.StatusNotFound},
	} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest("HEAD", tt.path, nil))
		if w.Code != tt.status {
			t.Errorf("HEAD %s: %d, want %d", tt.path, w.Code, tt.status)
		}
	}
}
