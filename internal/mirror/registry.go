package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Registry answers the requests of a pull from the content of Store:
// GET and HEAD of /v2/, /v2/<name>/manifests/<tag or digest> and
// /v2/<name>/blobs/<digest>, for the registry named by the ns query
// parameter (containerd names the registry it pulls from so when it asks a
// mirror). It serves nothing of a registry that Shares refuses.
type Registry struct {
	Store Store
	// Shares says whether the node shares the images of registry, e.g.
	// docker.io.
	Shares func(registry string) bool
}

// maxManifest bounds what Registry reads into memory to serve as a
// manifest; registries refuse larger ones too.
const maxManifest = 4 << 20

// tagPattern is a tag of the distribution spec.
var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

func (r Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	path, ns, ok := pullRequest(w, req)
	if !ok {
		return
	}
	if !r.Shares(ns) {
		registryError(w, http.StatusNotFound, "NAME_UNKNOWN", fmt.Sprintf("this node does not share images of registry %q", ns))
		return
	}
	if name, ref, ok := cutLast(path, "/manifests/"); ok {
		r.manifest(w, req, ns+"/"+name, ref)
		return
	}
	if _, ref, ok := cutLast(path, "/blobs/"); ok {
		r.blob(w, req, ref)
		return
	}
	registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "not a manifest or blob path: "+req.URL.Path)
}

// manifest serves the manifest or index of image name at ref, a tag or a
// digest.
func (r Registry) manifest(w http.ResponseWriter, req *http.Request, name, ref string) {
	ctx := req.Context()
	var desc ocispec.Descriptor
	if d, err := digest.Parse(ref); err == nil {
		info, err := r.Store.Info(ctx, d)
		if err != nil {
			storeError(w, err, "MANIFEST_UNKNOWN", "no manifest "+ref)
			return
		}
		desc = ocispec.Descriptor{Digest: d, Size: info.Size}
	} else if tagPattern.MatchString(ref) {
		if desc, err = r.Store.Image(ctx, name+":"+ref); err != nil {
			storeError(w, err, "MANIFEST_UNKNOWN", "no image "+name+":"+ref)
			return
		}
	} else {
		registryError(w, http.StatusBadRequest, "MANIFEST_INVALID", fmt.Sprintf("%q is neither a tag nor a digest", ref))
		return
	}
	if desc.Size > maxManifest {
		registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("%s is too large for a manifest", desc.Digest))
		return
	}
	data, err := r.read(ctx, desc)
	if err != nil {
		storeError(w, err, "MANIFEST_UNKNOWN", "no manifest "+desc.Digest.String())
		return
	}
	mediaType, ok := manifestType(data)
	if !ok {
		// A blob asked for as a manifest: containerd would store it as
		// one.
		registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", desc.Digest.String()+" is not a manifest")
		return
	}
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Header().Set("Docker-Content-Digest", desc.Digest.String())
	if req.Method == http.MethodGet {
		_, _ = w.Write(data)
	}
}

func (r Registry) read(ctx context.Context, desc ocispec.Descriptor) ([]byte, error) {
	ra, err := r.Store.ReaderAt(ctx, desc)
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

// blob serves the content of digest ref, with ranges.
func (r Registry) blob(w http.ResponseWriter, req *http.Request, ref string) {
	ctx := req.Context()
	d, err := digest.Parse(ref)
	if err != nil {
		registryError(w, http.StatusBadRequest, "DIGEST_INVALID", fmt.Sprintf("%q is not a digest", ref))
		return
	}
	info, err := r.Store.Info(ctx, d)
	if err != nil {
		storeError(w, err, "BLOB_UNKNOWN", "no blob "+ref)
		return
	}
	ra, err := r.Store.ReaderAt(ctx, ocispec.Descriptor{Digest: d, Size: info.Size})
	if err != nil {
		storeError(w, err, "BLOB_UNKNOWN", "no blob "+ref)
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

// pullRequest answers what both faces answer alike: anything but a pull,
// a path outside the registry API, the API's base, a request that names no
// registry (containerd names it, ns, when it asks a mirror). Otherwise it
// returns the path below /v2/ and the registry, for the face to serve.
func pullRequest(w http.ResponseWriter, req *http.Request) (path, ns string, ok bool) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		registryError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "this mirror only serves pulls")
		return "", "", false
	}
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	path, ok = strings.CutPrefix(req.URL.Path, "/v2/")
	if !ok {
		registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "not a registry API path: "+req.URL.Path)
		return "", "", false
	}
	if path == "" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
		return "", "", false
	}
	ns = req.URL.Query().Get("ns")
	if ns == "" {
		registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "no registry named (ns): containerd names it when it asks a mirror")
		return "", "", false
	}
	return path, ns, true
}
