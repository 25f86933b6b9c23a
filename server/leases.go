package server

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// leaderLeases are the leader election leases of the in-process components.
var leaderLeases = []string{"kube-controller-manager", "kube-scheduler"}

// leaseHolderGone is how long a leader lease may go unrenewed before its
// holder is taken for gone: a live leader renews it every retry period
// (kubeargs.WithLeaderElection: 10 s).
const leaseHolderGone = 15 * time.Second

// releaseOwnLeases frees the leader leases still held by an earlier run of
// kelp on this machine, so that a restarted server's controller-manager and
// scheduler lead within a retry period instead of waiting for the lease to
// expire. A clean stop releases them itself (packages controllermanager
// and scheduler); this is for a run that did not stop cleanly: killed,
// crashed, or cut off from power. Leader election identities are
// "<hostname>_<uuid>", but a lease held under this hostname is not proof
// enough: another server may have the same hostname (cloned machines, a
// Raspberry Pi's default), and freeing its lease would take the lead from
// a live leader, which then exits. So a lease is freed only once it has
// gone unrenewed for gone, and only if nobody renewed it meanwhile. It
// returns when every lease is freed or left alone: within gone.
func releaseOwnLeases(ctx context.Context, client kubernetes.Interface, hostname string, gone time.Duration) error {
	leases := client.CoordinationV1().Leases(metav1.NamespaceSystem)
	for _, name := range leaderLeases {
		lease, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			continue // none yet: a new cluster
		}
		holder := lease.Spec.HolderIdentity
		if holder == nil || !strings.HasPrefix(*holder, hostname+"_") || lease.Spec.RenewTime == nil {
			continue
		}
		renewed := lease.Spec.RenewTime.Time
		if wait := time.Until(renewed.Add(gone)); wait > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
			if lease, err = leases.Get(ctx, name, metav1.GetOptions{}); err != nil {
				return fmt.Errorf("read leader lease %s: %w", name, err)
			}
		}
		if !heldSince(lease, *holder, renewed) {
			log.WithField("lease", name).Warnf("the leader lease held under this server's hostname %q is renewed by a live process: does another server have the same hostname? Give each server its own", hostname)
			continue
		}
		// What client-go's leader election writes when it releases a
		// lease. The update carries the lease's resourceVersion, so a
		// renewal in between makes it fail rather than be undone.
		empty, one := "", int32(1)
		lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds = &empty, &one
		if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("release leader lease %s: %w", name, err)
		}
		log.WithField("lease", name).Debug("released the lease of the previous run")
	}
	return nil
}

// heldSince says whether lease is still held by holder and was not renewed
// after renewed.
func heldSince(lease *coordinationv1.Lease, holder string, renewed time.Time) bool {
	s := lease.Spec
	return s.HolderIdentity != nil && *s.HolderIdentity == holder && s.RenewTime != nil && !s.RenewTime.After(renewed)
}
