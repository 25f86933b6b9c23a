// Package etcdmembers removes a server from the embedded etcd cluster when
// its Node is deleted (`kubectl delete node`), the way an operator retires
// a server for good.
package etcdmembers

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/informer"
)

// removeTimeout bounds one member removal.
const removeTimeout = 30 * time.Second

var log = logrus.WithField("component", "etcd-members")

// Remover removes the etcd member named after a node (datastore.Members).
type Remover interface {
	Remove(ctx context.Context, name string) (bool, error)
}

// Run removes the etcd member of every Node deleted while it runs, until
// ctx ends. Every server runs it: the first to see a deletion removes the
// member, the others find none. Agents have no member, so deleting theirs
// changes nothing.
func Run(ctx context.Context, informers *informer.Cache, members Remover) error {
	nodes := informers.Core().V1().Nodes().Informer()
	deleted := make(chan string, 16)
	reg, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if node, ok := obj.(*corev1.Node); ok {
				deleted <- node.Name
			}
		},
	})
	if err != nil {
		return err
	}
	defer func() { _ = nodes.RemoveEventHandler(reg) }()
	informers.Start()
	for {
		select {
		case <-ctx.Done():
			return nil
		case name := <-deleted:
			remove(ctx, members, name)
		}
	}
}

func remove(ctx context.Context, members Remover, name string) {
	ctx, cancel := context.WithTimeout(ctx, removeTimeout)
	defer cancel()
	removed, err := members.Remove(ctx, name)
	switch {
	case err != nil:
		log.WithError(err).WithField("node", name).Error("Node deleted, but its etcd member could not be removed: remove it with `kelp etcdctl member remove`")
	case removed:
		log.WithField("node", name).Info("Node deleted: removed its etcd member")
	}
}
