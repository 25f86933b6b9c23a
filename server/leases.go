package server

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// leaderLeases are the leader election leases of the in-process components.
var leaderLeases = []string{"kube-controller-manager", "kube-scheduler"}

// releaseOwnLeases frees the leader leases still held by an earlier run of
// kelp on this machine, so that a restarted server's controller-manager and
// scheduler lead at once instead of waiting for the lease to expire. Leader
// election identities are "<hostname>_<uuid>"; only one kelp server runs
// per machine (it holds the apiserver port), so a lease held under this
// hostname belongs to a process that is gone.
func releaseOwnLeases(ctx context.Context, client kubernetes.Interface, hostname string) error {
	leases := client.CoordinationV1().Leases(metav1.NamespaceSystem)
	for _, name := range leaderLeases {
		lease, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			continue // none yet: a new cluster
		}
		holder := lease.Spec.HolderIdentity
		if holder == nil || !strings.HasPrefix(*holder, hostname+"_") {
			continue
		}
		// What client-go's leader election writes when it releases a lease.
		empty, one := "", int32(1)
		lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds = &empty, &one
		if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("release leader lease %s: %w", name, err)
		}
		log.WithField("lease", name).Debug("released the lease of the previous run")
	}
	return nil
}
