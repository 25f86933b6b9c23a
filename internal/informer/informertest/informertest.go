// Package informertest gives a test an informer cache that runs until the
// test ends.
package informertest

import (
	"context"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/informer"
)

// Cache is informer.New(client, trim), run until t ends.
func Cache(t testing.TB, client kubernetes.Interface, trim cache.TransformFunc) *informer.Cache {
	c := informer.New(client, trim)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		_ = c.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return c
}
