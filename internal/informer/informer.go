// Package informer holds a process part's one informer cache: the server's
// controllers share one, the node's controllers another, so that each kind
// of object is listed, watched and held once however many of them read it
// (DESIGN.md §8).
package informer

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Cache is a shared informer factory whose informers run for the life of
// the process part, not of the controller that asked for them first.
type Cache struct {
	informers.SharedInformerFactory
	stop     chan struct{}
	stopOnce sync.Once
}

// New makes the cache of client's objects; trim, if not nil, is applied to
// every object of every informer before it is stored, so it must keep of
// each type what every reader of that type uses.
func New(client kubernetes.Interface, trim cache.TransformFunc) *Cache {
	var opts []informers.SharedInformerOption
	if trim != nil {
		opts = append(opts, informers.WithTransform(trim))
	}
	return &Cache{
		SharedInformerFactory: informers.NewSharedInformerFactoryWithOptions(client, 0, opts...),
		stop:                  make(chan struct{}),
	}
}

// Start starts the informers asked for so far that are not running yet.
// Their owner calls it once every part registered its informers; a
// controller that asks for its informers later (one that runs only while
// it leads, or from its own goroutine) calls it too, after it asked. It
// shadows the factory's Start(stopCh): the informers stop with Run, never
// with a controller.
func (c *Cache) Start() {
	c.SharedInformerFactory.Start(c.stop)
}

// Run holds the informers until ctx ends, then stops them and waits for
// them to end.
func (c *Cache) Run(ctx context.Context) error {
	<-ctx.Done()
	c.stopOnce.Do(func() { close(c.stop) })
	c.Shutdown()
	return nil
}

// Trim drops of every object what no kelp controller reads and a write of
// the object leaves as it was: the record of which manager set which
// field (an update without it keeps the stored one), and of a Node the
// images it holds (a Node's status is written through its own
// subresource, by patches that leave out what both sides lack). These are
// most of a Node, and much of any object.
func Trim(obj any) (any, error) {
	if o, ok := obj.(metav1.Object); ok {
		o.SetManagedFields(nil)
	}
	if n, ok := obj.(*corev1.Node); ok {
		n.Status.Images = nil
	}
	return obj, nil
}
