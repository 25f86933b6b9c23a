// Command mkimage packs one static binary into a single-layer OCI image layout
// tarball that containerd can import, with no registry or image tool involved.
//
//	mkimage -binary pause -path /pause -name docker.io/kelp-dev/pause:1.0.0 -arch amd64 -out pause.tar
//
// The output is byte-for-byte reproducible: every timestamp is fixed and the
// tar and gzip streams carry no host details.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	_ "crypto/sha256" // registers the hash go-digest uses
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// annotationImageName is the annotation containerd's importer reads for the
// full image name (containerd's images.AnnotationImageName).
const annotationImageName = "io.containerd.image.name"

// epoch is the fixed time stamped on every file and in the config, so that
// the same binary always yields the same image digest.
var epoch = time.Unix(0, 0).UTC()

type options struct {
	binary string // file to put into the image
	path   string // absolute path of the file inside the image; also the entrypoint
	name   string // full image reference, e.g. docker.io/kelp-dev/pause:1.0.0
	arch   string // GOARCH of the binary
	user   string // user the entrypoint runs as
	out    string // tarball to write
}

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "", "static binary to pack")
	flag.StringVar(&o.path, "path", "", "absolute path of the binary inside the image (default /<basename>)")
	flag.StringVar(&o.name, "name", "", "image reference, e.g. docker.io/kelp-dev/pause:1.0.0")
	flag.StringVar(&o.arch, "arch", "", "GOARCH of the binary")
	flag.StringVar(&o.user, "user", "", "user the entrypoint runs as, e.g. 65535:65535")
	flag.StringVar(&o.out, "out", "", "OCI layout tarball to write")
	flag.Parse()
	if o.path == "" && o.binary != "" {
		o.path = "/" + path.Base(o.binary)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.binary == "" || o.name == "" || o.arch == "" || o.out == "" {
		return fmt.Errorf("-binary, -name, -arch and -out are required")
	}
	if !path.IsAbs(o.path) {
		return fmt.Errorf("-path %q must be absolute", o.path)
	}
	tag, err := tagOf(o.name)
	if err != nil {
		return err
	}
	bin, err := os.ReadFile(o.binary)
	if err != nil {
		return fmt.Errorf("read binary: %w", err)
	}

	layerTar, err := tarOf([]file{{name: strings.TrimPrefix(o.path, "/"), mode: 0o755, data: bin}})
	if err != nil {
		return fmt.Errorf("build layer: %w", err)
	}
	layer, err := gzipOf(layerTar)
	if err != nil {
		return fmt.Errorf("compress layer: %w", err)
	}

	platform := ocispec.Platform{OS: "linux", Architecture: o.arch}
	config, err := json.Marshal(ocispec.Image{
		Created:  &epoch,
		Platform: platform,
		Config: ocispec.ImageConfig{
			User:       o.user,
			Entrypoint: []string{o.path},
		},
		RootFS: ocispec.RootFS{
			Type:    "layers",
			DiffIDs: []digest.Digest{digest.FromBytes(layerTar)},
		},
		History: []ocispec.History{{Created: &epoch, CreatedBy: "kelp scripts/bundle/mkimage " + o.path}},
	})
	if err != nil {
		return err
	}
	configDesc := descriptorOf(ocispec.MediaTypeImageConfig, config)
	layerDesc := descriptorOf(ocispec.MediaTypeImageLayerGzip, layer)

	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Layers:    []ocispec.Descriptor{layerDesc},
	})
	if err != nil {
		return err
	}
	manifestDesc := descriptorOf(ocispec.MediaTypeImageManifest, manifest)
	manifestDesc.Platform = &platform
	manifestDesc.Annotations = map[string]string{
		annotationImageName:       o.name,
		ocispec.AnnotationRefName: tag,
	}

	index, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manifestDesc},
	})
	if err != nil {
		return err
	}
	layout, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return err
	}

	archive, err := tarOf([]file{
		{name: ocispec.ImageLayoutFile, mode: 0o644, data: layout},
		{name: "index.json", mode: 0o644, data: index},
		{name: "blobs/", mode: 0o755, dir: true},
		{name: "blobs/sha256/", mode: 0o755, dir: true},
		blob(manifestDesc, manifest),
		blob(configDesc, config),
		blob(layerDesc, layer),
	})
	if err != nil {
		return fmt.Errorf("build layout tarball: %w", err)
	}
	if err := os.WriteFile(o.out, archive, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", o.out, err)
	}
	return nil
}

// tagOf returns the tag of ref, which OCI layouts carry as
// org.opencontainers.image.ref.name (containerd's exporter does the same).
func tagOf(ref string) (string, error) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") || i == len(ref)-1 {
		return "", fmt.Errorf("image name %q has no tag", ref)
	}
	return ref[i+1:], nil
}

func descriptorOf(mediaType string, data []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
}

func blob(d ocispec.Descriptor, data []byte) file {
	return file{name: "blobs/sha256/" + d.Digest.Encoded(), mode: 0o644, data: data}
}

type file struct {
	name string
	mode int64
	dir  bool
	data []byte
}

func tarOf(files []file) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{
			Name:    f.name,
			Mode:    f.mode,
			ModTime: epoch,
		}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func gzipOf(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
