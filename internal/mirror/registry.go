package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Registry answers the pulls of the other nodes' mirrors from the content
// of Store: GET and HEAD of /v2/, /v2/<name>/manifests/<digest> and
// /v2/<name>/blobs/<digest>, for the registry named by the ns query
// parameter (containerd names the registry it pulls from so when it asks a
// mirror).
//
// It answers no tag: what a tag names is the registry's word, and a node
// that answered it would make every other node run the image its root
// chose (containerd checks content against the digest it is given, which
// such an answer names). Nor does it serve a digest that is not content of
// an image of the registry asked for, one the node shares: the content
// store holds the images of the registries the node does not share too,
// and content of no image at all.
type Registry struct {
	store  Store
	shares func(registry string) bool

	mu sync.Mutex
	// held are the digests that each image target names (see walk), of
	// the images of the registries the node shares: content does not
	// change, so they hold for as long as an image has the target.
	held map[digest.Digest]map[digest.Digest]bool
}

// NewRegistry serves the content of store for the registries shares
// accepts, e.g. docker.io.
func NewRegistry(store Store, shares func(registry string) bool) *Registry {
	return &Registry{store: store, shares: shares}
}

// maxManifest bounds what is read into memory as a manifest, here and in
// Mirror; registries refuse larger ones too.
const maxManifest = 4 << 20

func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	p, ok := pullRequest(w, req, r.shares)
	if !ok {
		return
	}
	held, err := r.holds(req.Context(), p.registry, p.digest)
	if err != nil {
		storeError(w, err, p.unknown(), "no "+p.digest.String())
		return
	}
	if !held {
		registryError(w, http.StatusNotFound, p.unknown(), fmt.Sprintf("no image of %s on this node has %s", p.registry, p.digest))
		return
	}
	if p.manifest {
		r.manifest(w, req, p.digest)
	} else {
		r.blob(w, req, p.digest)
	}
}

// holds reports whether d is content of an image of registry.
func (r *Registry) holds(ctx context.Context, registry string, d digest.Digest) (bool, error) {
	imgs, err := r.store.Images(ctx)
	if err != nil {
		return false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	held := map[digest.Digest]map[digest.Digest]bool{}
	found := false
	for _, img := range imgs {
		of, ok := registryOf(img.Name)
		if !ok || !r.shares(of) {
			continue
		}
		target := img.Target.Digest
		names, ok := held[target]
		if !ok {
			names, ok = r.held[target]
		}
		if !ok {
			if names, err = r.walk(ctx, img.Target); err != nil {
				log.WithError(err).WithField("image", img.Name).Debug("not shared: its content cannot be read")
				continue
			}
		}
		held[target] = names
		found = found || (of == registry && names[d])
	}
	r.held = held
	return found, nil
}

// walk returns the digests that desc names, its own included, down to the
// layers, through the manifests the store has: an index names those of
// every platform, and a node pulls one. A platform pulled later under an
// index walked already is not served.
func (r *Registry) walk(ctx context.Context, desc ocispec.Descriptor) (map[digest.Digest]bool, error) {
	names := map[digest.Digest]bool{}
	var visit func(ocispec.Descriptor) error
	visit = func(desc ocispec.Descriptor) error {
		if names[desc.Digest] {
			return nil
		}
		children, err := images.Children(ctx, r.store, desc)
		if errdefs.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", desc.Digest, err)
		}
		names[desc.Digest] = true
		for _, c := range children {
			if err := visit(c); err != nil {
				return err
			}
		}
		return nil
	}
	return names, visit(desc)
}

// registryOf returns the registry of an image name as containerd keeps
// it, e.g. docker.io of docker.io/library/nginx:1.27; the CRI's names of
// images by their ID (sha256:...) name none.
func registryOf(name string) (string, bool) {
	registry, _, ok := strings.Cut(name, "/")
	return registry, ok && registry != ""
}

// manifest serves the manifest or index d.
func (r *Registry) manifest(w http.ResponseWriter, req *http.Request, d digest.Digest) {
	ctx := req.Context()
	info, err := r.store.Info(ctx, d)
	if err != nil {
		storeError(w, err, "MANIFEST_UNKNOWN", "no manifest "+d.String())
		return
	}
	if info.Size > maxManifest {
		registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("%s is too large for a manifest", d))
		return
	}
	desc := ocispec.Descriptor{Digest: d, Size: info.Size}
	data, err := r.read(ctx, desc)
	if err != nil {
		storeError(w, err, "MANIFEST_UNKNOWN", "no manifest "+d.String())
		return
	}
	mediaType, ok := manifestType(data)
	if !ok {
		// A blob asked for as a manifest: containerd would store it as
		// one.
		registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", d.String()+" is not a manifest")
		return
	}
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Header().Set("Docker-Content-Digest", d.String())
	if req.Method == http.MethodGet {
		_, _ = w.Write(data)
	}
}

func (r *Registry) read(ctx context.Context, desc ocispec.Descriptor) ([]byte, error) {
	ra, err := r.store.ReaderAt(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer ra.Close()
	data := make([]byte, ra.Size())
	if _, err := ra.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if digest.FromBytes(data) != desc.Digest {
		return nil, fmt.Errorf("%s: the content store holds other bytes: %w", desc.Digest, errdefs.ErrNotFound)
	}
	return data, nil
}

// blob serves the content of d, with ranges.
func (r *Registry) blob(w http.ResponseWriter, req *http.Request, d digest.Digest) {
	ctx := req.Context()
	info, err := r.store.Info(ctx, d)
	if err != nil {
		storeError(w, err, "BLOB_UNKNOWN", "no blob "+d.String())
		return
	}
	ra, err := r.store.ReaderAt(ctx, ocispec.Descriptor{Digest: d, Size: info.Size})
	if err != nil {
		storeError(w, err, "BLOB_UNKNOWN", "no blob "+d.String())
		return
	}
	defer ra.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", d.String())
	// A digest names its content for good: any modification time will do.
	http.ServeContent(w, req, "", time.Time{}, io.NewSectionReader(ra, 0, info.Size))
}

// manifestTypes are the media types containerd pulls as manifests.
var manifestTypes = []string{
	ocispec.MediaTypeImageManifest, ocispec.MediaTypeImageIndex,
	images.MediaTypeDockerSchema2Manifest, images.MediaTypeDockerSchema2ManifestList,
}

// manifestType returns the media type of the manifest or index data: its
// own mediaType field, or for an OCI one without, what its fields make
// it.
func manifestType(data []byte) (string, bool) {
	var m struct {
		MediaType string          `json:"mediaType"`
		Manifests json.RawMessage `json:"manifests"`
		Config    json.RawMessage `json:"config"`
		Layers    json.RawMessage `json:"layers"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return "", false
	}
	switch {
	case slices.Contains(manifestTypes, m.MediaType):
		return m.MediaType, true
	case m.MediaType != "":
		return "", false
	case m.Manifests != nil:
		return ocispec.MediaTypeImageIndex, true
	case m.Config != nil && m.Layers != nil:
		return ocispec.MediaTypeImageManifest, true
	}
	return "", false
}

func storeError(w http.ResponseWriter, err error, code, notFound string) {
	if errdefs.IsNotFound(err) {
		registryError(w, http.StatusNotFound, code, notFound)
		return
	}
	log.WithError(err).Warn("read containerd's content store")
	registryError(w, http.StatusInternalServerError, "UNKNOWN", "the node's containerd: "+err.Error())
}

func registryError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": code, "message": message}}})
}

func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// pull is what a pull request asks for: a manifest or a blob, by digest,
// of a registry.
type pull struct {
	registry string
	manifest bool
	digest   digest.Digest
}

// unknown is the registry API's error code for p not found.
func (p pull) unknown() string {
	if p.manifest {
		return "MANIFEST_UNKNOWN"
	}
	return "BLOB_UNKNOWN"
}

// pullRequest answers what both faces answer alike: anything but a pull,
// a path outside the registry API, the API's base, a request that names no
// registry (containerd names it, ns, when it asks a mirror) or one that
// shares refuses, and a tag, which only the registry resolves (see
// Registry). Otherwise it returns what is asked for, for the face to
// serve.
func pullRequest(w http.ResponseWriter, req *http.Request, shares func(registry string) bool) (pull, bool) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		registryError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "this mirror only serves pulls")
		return pull{}, false
	}
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	path, ok := strings.CutPrefix(req.URL.Path, "/v2/")
	if !ok {
		registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "not a registry API path: "+req.URL.Path)
		return pull{}, false
	}
	if path == "" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
		return pull{}, false
	}
	p := pull{registry: req.URL.Query().Get("ns")}
	if p.registry == "" {
		registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "no registry named (ns): containerd names it when it asks a mirror")
		return pull{}, false
	}
	if !shares(p.registry) {
		registryError(w, http.StatusNotFound, "NAME_UNKNOWN", fmt.Sprintf("this node does not share images of registry %q with the other nodes (mirrors in its registries.yaml)", p.registry))
		return pull{}, false
	}
	var ref string
	if _, ref, ok = cutLast(path, "/manifests/"); ok {
		p.manifest = true
	} else if _, ref, ok = cutLast(path, "/blobs/"); !ok {
		registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "not a manifest or blob path: "+req.URL.Path)
		return pull{}, false
	}
	d, err := digest.Parse(ref)
	switch {
	case err != nil && p.manifest:
		registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("%q is not a digest: nodes pull manifests from each other by digest only, a tag is resolved by the registry", ref))
		return pull{}, false
	case err != nil:
		registryError(w, http.StatusBadRequest, "DIGEST_INVALID", fmt.Sprintf("%q is not a digest", ref))
		return pull{}, false
	}
	p.digest = d
	return p, true
}
