package images

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/fsnotify/fsnotify"
	"github.com/klauspost/compress/zstd"
	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// Namespace is the containerd namespace of the CRI plugin, where the
// kubelet looks for images.
const Namespace = "k8s.io"

// pinnedLabel marks an image the CRI plugin reports as pinned; the kubelet
// never garbage-collects a pinned image.
var pinnedLabel = map[string]string{"io.cri-containerd.pinned": "pinned"}

var log = logrus.WithField("component", "images")

// Importer loads tarballs into one containerd.
type Importer struct {
	Client      *client.Client
	Snapshotter string
	// StatePath remembers which files were imported, so an unchanged
	// tarball is not read again at the next start.
	StatePath string
}

// IsTarball reports whether name is a file the airgap directory imports.
func IsTarball(name string) bool {
	for _, ext := range []string{".tar", ".tar.gz", ".tgz", ".tar.zst"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return false
}

// ImportFile imports one tarball (OCI layout or docker save, optionally
// gzip or zstd compressed), pins and unpacks its images, and returns their
// names.
func (im Importer) ImportFile(ctx context.Context, path string) ([]string, error) {
	ctx = namespaces.WithNamespace(ctx, Namespace)
	r, err := openTarball(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	imgs, err := im.Client.Import(ctx, r, client.WithImageLabels(pinnedLabel), client.WithSkipMissing())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("%s: no image in the tarball", path)
	}
	var names []string
	for _, img := range imgs {
		if err := client.NewImage(im.Client, img).Unpack(ctx, im.Snapshotter); err != nil {
			return nil, fmt.Errorf("%s: unpack %s: %w", path, img.Name, err)
		}
		names = append(names, img.Name)
	}
	return names, nil
}

// openTarball opens the tar stream of a tarball, uncompressing it as its
// name says.
func openTarball(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	switch {
	case strings.HasSuffix(path, ".gz"), strings.HasSuffix(path, ".tgz"):
		zr, err := gzip.NewReader(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: not gzip: %w", path, err)
		}
		return readCloser{zr, f}, nil
	case strings.HasSuffix(path, ".zst"):
		zr, err := zstd.NewReader(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: not zstd: %w", path, err)
		}
		return readCloser{zr, closerFunc(func() error { zr.Close(); return f.Close() })}, nil
	}
	return f, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// CheckTarball says why the file at path is no image tarball the airgap
// directory can import: its name, its compression, or a tar without the
// index.json of an OCI layout or the manifest.json of `docker save`.
func CheckTarball(path string) error {
	if !IsTarball(path) {
		return fmt.Errorf("%s: an image tarball is named *.tar, *.tar.gz, *.tgz or *.tar.zst", path)
	}
	r, err := openTarball(path)
	if err != nil {
		return err
	}
	defer r.Close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return fmt.Errorf("%s: no image in it (neither index.json nor manifest.json): make one with `docker save`, `podman save` or `ctr images export`", path)
		}
		if err != nil {
			return fmt.Errorf("%s: not a tar file: %w", path, err)
		}
		if name := strings.TrimPrefix(hdr.Name, "./"); name == "index.json" || name == "manifest.json" {
			return nil
		}
	}
}

// imported is what the state file remembers of one tarball.
type imported struct {
	Size    int64     `json:"size"`
	ModTime time.Time `json:"modTime"`
	Images  []string  `json:"images"`
}

// SyncDir imports every tarball in dir that is new or changed since it was
// last imported, or whose images are gone from containerd. A tarball that
// fails is reported by name; the others still import.
func (im Importer) SyncDir(ctx context.Context, dir string) error {
	ctx = namespaces.WithNamespace(ctx, Namespace)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("airgap images: %w", err)
	}
	state := im.loadState()
	next := map[string]imported{}
	var errs []error
	for _, e := range entries {
		if !e.Type().IsRegular() || !IsTarball(e.Name()) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		info, err := e.Info()
		if err != nil {
			continue
		}
		seen, ok := state[e.Name()]
		if ok && seen.Size == info.Size() && seen.ModTime.Equal(info.ModTime()) && im.allPresent(ctx, seen.Images) {
			next[e.Name()] = seen
			continue
		}
		started := time.Now()
		names, err := im.ImportFile(ctx, path)
		if err != nil {
			errs = append(errs, err)
			log.WithError(err).Error("airgap image tarball not imported; fix or remove it")
			continue
		}
		log.WithFields(logrus.Fields{"file": e.Name(), "images": strings.Join(names, ","), "took": time.Since(started).Round(time.Millisecond)}).Info("imported airgap images")
		next[e.Name()] = imported{Size: info.Size(), ModTime: info.ModTime(), Images: names}
	}
	if err := im.saveState(next); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (im Importer) allPresent(ctx context.Context, names []string) bool {
	store := im.Client.ImageService()
	for _, name := range names {
		if _, err := store.Get(ctx, name); err != nil {
			return false
		}
	}
	return len(names) > 0
}

// ImportedFrom returns the images imported from the airgap file of the given
// name, size and modification time, as the importer with state file
// statePath recorded them; ok is false until it has imported that file.
func ImportedFrom(statePath, name string, size int64, modTime time.Time) (names []string, ok bool) {
	seen, ok := Importer{StatePath: statePath}.loadState()[name]
	if !ok || seen.Size != size || !seen.ModTime.Equal(modTime) {
		return nil, false
	}
	return seen.Images, true
}

func (im Importer) loadState() map[string]imported {
	state := map[string]imported{}
	data, err := os.ReadFile(im.StatePath)
	if err == nil {
		_ = json.Unmarshal(data, &state) // a damaged state only costs a re-import
	}
	return state
}

func (im Importer) saveState(state map[string]imported) error {
	data, err := json.MarshalIndent(state, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(im.StatePath, data, 0o600); err != nil {
		return fmt.Errorf("airgap images state: %w", err)
	}
	return nil
}

// WatchDir imports tarballs that appear in dir until ctx ends. A burst of
// writes (a file being copied in) is imported once it has been quiet for a
// second.
func (im Importer) WatchDir(ctx context.Context, dir string) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch airgap images: %w", err)
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch airgap images %s: %w", dir, err)
	}
	// A file that arrived after the start-up import and before the watch
	// began would otherwise wait for the next event.
	_ = im.SyncDir(ctx, dir)
	quiet := time.NewTimer(time.Hour)
	quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-w.Events:
			if IsTarball(ev.Name) && ev.Op&(fsnotify.Create|fsnotify.Write|fsnotify.Rename) != 0 {
				quiet.Reset(time.Second)
			}
		case err := <-w.Errors:
			log.WithError(err).Warn("watch airgap images")
		case <-quiet.C:
			_ = im.SyncDir(ctx, dir) // failures are logged per file
		}
	}
}

// EnsurePinned imports the tarball at path unless ref is already present.
func (im Importer) EnsurePinned(ctx context.Context, ref, path string) error {
	ctx = namespaces.WithNamespace(ctx, Namespace)
	if img, err := im.Client.ImageService().Get(ctx, ref); err == nil {
		if img.Labels["io.cri-containerd.pinned"] == "pinned" {
			return nil
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("look up %s: %w", ref, err)
	}
	names, err := im.ImportFile(ctx, path)
	if err != nil {
		return err
	}
	if !slices.Contains(names, ref) {
		return fmt.Errorf("%s holds %v, not %s", path, names, ref)
	}
	return nil
}
