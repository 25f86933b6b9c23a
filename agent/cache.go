package agent

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/informer"
	"github.com/kelp-dev/kelp/internal/localstorage"
	"github.com/kelp-dev/kelp/internal/mirror"
	"github.com/kelp-dev/kelp/internal/netpol"
	"github.com/kelp-dev/kelp/internal/overlay"
)

// trim keeps of each object in the node's cache what the node's
// controllers read of its kind: every node caches every Node, Pod and
// claim of the cluster. Of a Node, what the overlay reads and the
// registry mirror's status; of a Pod, network policy's; of a claim, local
// storage's; of any other object, all but what informer.Trim drops.
func trim(nodeName string) cache.TransformFunc {
	claim := localstorage.TrimClaim(nodeName)
	return func(obj any) (any, error) {
		switch o := obj.(type) {
		case *corev1.Node:
			t, err := overlay.TrimNode(o)
			if n, ok := t.(*corev1.Node); ok {
				n.Status = mirror.TrimNodeStatus(o.Status)
			}
			return t, err
		case *corev1.Pod:
			return netpol.TrimPod(o)
		case *corev1.PersistentVolumeClaim:
			return claim(o)
		}
		return informer.Trim(obj)
	}
}
