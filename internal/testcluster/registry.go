package testcluster

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Registry is a read-only OCI distribution registry for a node's
// containerd to pull from: it answers the requests of a pull (the API
// check, manifests by tag or digest, blobs), over plain HTTP, and nothing
// else. Images get into it with Push.
type Registry struct {
	mu    sync.Mutex
	blobs map[digest.Digest]blob
	// tags are the manifests by "<repository>:<tag>".
	tags map[string]digest.Digest
}

type blob struct {
	mediaType string
	data      []byte
}

// ServeRegistry serves a new, empty Registry on l until the test ends.
func ServeRegistry(t *testing.T, l net.Listener) *Registry {
	r := &Registry{blobs: map[digest.Digest]blob{}, tags: map[string]digest.Digest{}}
	srv := &http.Server{Handler: r}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

// Push adds the image in the OCI image tarball at path (BuildTestImage's)
// as repository:tag, e.g. "kelp-test/pulled:1.0". The image's config gets
// a label naming it, so that it is an image of its own, not one more name
// of the tarball's image that a node may have imported already: removing
// either leaves the other.
func (r *Registry) Push(path, name string) error {
	files, err := readTar(path)
	if err != nil {
		return err
	}
	var index ocispec.Index
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		return fmt.Errorf("%s: want an OCI image layout with one manifest (%v)", path, err)
	}
	blobOf := func(d digest.Digest) []byte { return files["blobs/"+d.Algorithm().String()+"/"+d.Encoded()] }
	var manifest ocispec.Manifest
	if err := json.Unmarshal(blobOf(index.Manifests[0].Digest), &manifest); err != nil {
		return fmt.Errorf("%s: the manifest: %w", path, err)
	}
	var config ocispec.Image
	if err := json.Unmarshal(blobOf(manifest.Config.Digest), &config); err != nil {
		return fmt.Errorf("%s: the image config: %w", path, err)
	}
	if config.Config.Labels == nil {
		config.Config.Labels = map[string]string{}
	}
	config.Config.Labels["test.kelp.dev/pushed-as"] = name
	configData, err := json.Marshal(config)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range manifest.Layers {
		data := blobOf(l.Digest)
		if data == nil {
			return fmt.Errorf("%s: no blob %s", path, l.Digest)
		}
		r.blobs[l.Digest] = blob{l.MediaType, data}
	}
	manifest.Config = ocispec.Descriptor{MediaType: manifest.Config.MediaType, Digest: digest.FromBytes(configData), Size: int64(len(configData))}
	r.blobs[manifest.Config.Digest] = blob{manifest.Config.MediaType, configData}
	manifestData, err := json.Marshal(manifest)
	if err != nil {
		return err
	}
	d := digest.FromBytes(manifestData)
	r.blobs[d] = blob{ocispec.MediaTypeImageManifest, manifestData}
	r.tags[name] = d
	return nil
}

// ServeHTTP answers GET and HEAD of /v2/, /v2/<name>/manifests/<ref> and
// /v2/<name>/blobs/<digest>.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		registryError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "this registry only serves pulls")
		return
	}
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	path, ok := strings.CutPrefix(req.URL.Path, "/v2/")
	if !ok {
		http.NotFound(w, req)
		return
	}
	if path == "" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var b blob
	var d digest.Digest
	if name, ref, ok := cutLast(path, "/manifests/"); ok {
		if d, ok = r.tags[name+":"+ref]; !ok {
			d = digest.Digest(ref)
		}
		if b, ok = r.blobs[d]; !ok || !strings.Contains(b.mediaType, "manifest") {
			registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", "no manifest "+name+":"+ref)
			return
		}
	} else if _, ref, ok := cutLast(path, "/blobs/"); ok {
		d = digest.Digest(ref)
		if b, ok = r.blobs[d]; !ok {
			registryError(w, http.StatusNotFound, "BLOB_UNKNOWN", "no blob "+ref)
			return
		}
	} else {
		registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "no "+path)
		return
	}
	w.Header().Set("Content-Type", b.mediaType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b.data)))
	w.Header().Set("Docker-Content-Digest", d.String())
	if req.Method == http.MethodGet {
		_, _ = w.Write(b.data)
	}
}

func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

func registryError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": code, "message": message}}})
}

// readTar returns the regular files of the tarball at path by name.
func readTar(path string) (map[string][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		files[strings.TrimPrefix(h.Name, "./")] = data
	}
}
