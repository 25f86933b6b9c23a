package mirror

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kelp-dev/kelp/internal/pki"
)

// fakeStore is a node's images (their targets by name) and content in
// memory.
type fakeStore struct {
	images map[string]ocispec.Descriptor
	blobs  map[digest.Digest][]byte
}

func (f fakeStore) Images(context.Context) ([]images.Image, error) {
	var out []images.Image
	for name, target := range f.images {
		out = append(out, images.Image{Name: name, Target: target})
	}
	return out, nil
}

func (f fakeStore) Info(_ context.Context, d digest.Digest) (content.Info, error) {
	if b, ok := f.blobs[d]; ok {
		return content.Info{Digest: d, Size: int64(len(b))}, nil
	}
	return content.Info{}, fmt.Errorf("content %v: %w", d, errdefs.ErrNotFound)
}

func (f fakeStore) ReaderAt(_ context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	if b, ok := f.blobs[desc.Digest]; ok {
		return readerAt{bytes.NewReader(b)}, nil
	}
	return nil, fmt.Errorf("content %v: %w", desc.Digest, errdefs.ErrNotFound)
}

type readerAt struct{ *bytes.Reader }

func (readerAt) Close() error { return nil }

// fixture is an image app:1.0 of registry.example.com: an index (without
// a mediaType, as OCI allows) of one manifest of a config and a layer.
type fixture struct {
	store                   fakeStore
	index, manifest, layer  []byte
	indexD, manifestD, layD digest.Digest
}

// add puts data in the store.
func (f fixture) add(data []byte) digest.Digest {
	d := digest.FromBytes(data)
	f.store.blobs[d] = data
	return d
}

// imageDigests are the digests of an image of one manifest.
type imageDigests struct{ manifest, layer digest.Digest }

// image adds an image name of one manifest of an empty config and layer.
func (f fixture) image(t testing.TB, name string, layer []byte) imageDigests {
	t.Helper()
	config := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}`)
	m := ocispec.Manifest{
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: f.add(config), Size: int64(len(config))},
		Layers:    []ocispec.Descriptor{{MediaType: ocispec.MediaTypeImageLayer, Digest: f.add(layer), Size: int64(len(layer))}},
	}
	m.SchemaVersion = 2
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	d := f.add(data)
	f.store.images[name] = ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: d, Size: int64(len(data))}
	return imageDigests{manifest: d, layer: m.Layers[0].Digest}
}

func newFixture(t testing.TB) fixture {
	t.Helper()
	f := fixture{store: fakeStore{images: map[string]ocispec.Descriptor{}, blobs: map[digest.Digest][]byte{}}}
	marshal := func(v any) []byte {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	f.layer = bytes.Repeat([]byte("layer bytes "), 1000)
	f.layD = f.add(f.layer)
	config := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}`)
	configD := f.add(config)
	f.manifest = marshal(ocispec.Manifest{
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: configD, Size: int64(len(config))},
		Layers:    []ocispec.Descriptor{{MediaType: ocispec.MediaTypeImageLayer, Digest: f.layD, Size: int64(len(f.layer))}},
	})
	f.manifest = bytes.Replace(f.manifest, []byte(`{`), []byte(`{"schemaVersion":2,`), 1)
	f.manifestD = f.add(f.manifest)
	f.index = []byte(fmt.Sprintf(`{"schemaVersion":2,"manifests":[{"mediaType":%q,"digest":%q,"size":%d}]}`, ocispec.MediaTypeImageManifest, f.manifestD, len(f.manifest)))
	f.indexD = f.add(f.index)
	f.store.images["registry.example.com/app:1.0"] = ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: f.indexD, Size: int64(len(f.index))}
	return f
}

// testCA signs certificates into files in dir.
type testCA struct {
	t    testing.TB
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{t: t, dir: t.TempDir(), cert: cert, key: key}
	ca.file = filepath.Join(ca.dir, "ca.crt")
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue signs a client certificate for cn in orgs.
func (ca *testCA) issue(cn string, orgs ...string) pki.Pair {
	t := ca.t
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := pki.Pair{Cert: filepath.Join(ca.dir, serial.String()+".crt"), Key: filepath.Join(ca.dir, serial.String()+".key")}
	writePEM(t, p.Cert, "CERTIFICATE", der)
	writePEM(t, p.Key, "EC PRIVATE KEY", keyDER)
	return p
}

// node is the identity of the controllers of node name.
func (ca *testCA) node(name string) Identity {
	return Identity{Cert: ca.issue(pki.ControllerUser(name), pki.ControllerGroup), ClientCA: ca.file}
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
