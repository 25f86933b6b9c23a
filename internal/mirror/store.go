package mirror

import (
	"context"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	nodeimages "github.com/kelp-dev/kelp/internal/images"
)

// Store is what Registry serves from: the node's images, whose names say
// which registry their content is of, and its content by digest. Errors of
// things it lacks satisfy errdefs.IsNotFound.
type Store interface {
	Images(ctx context.Context) ([]images.Image, error)
	Info(ctx context.Context, d digest.Digest) (content.Info, error)
	ReaderAt(ctx context.Context, desc ocispec.Descriptor) (content.ReaderAt, error)
}

// containerdStore is a Store on a containerd client, in the kubelet's
// namespace.
type containerdStore struct{ c *client.Client }

var _ Store = containerdStore{}

func (s containerdStore) Images(ctx context.Context) ([]images.Image, error) {
	return s.c.ImageService().List(namespaces.WithNamespace(ctx, nodeimages.Namespace))
}

func (s containerdStore) Info(ctx context.Context, d digest.Digest) (content.Info, error) {
	return s.c.ContentStore().Info(namespaces.WithNamespace(ctx, nodeimages.Namespace), d)
}

func (s containerdStore) ReaderAt(ctx context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	return s.c.ContentStore().ReaderAt(namespaces.WithNamespace(ctx, nodeimages.Namespace), desc)
}
