package server

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func leaderLease(name, holder string, renewed time.Time) *coordinationv1.Lease {
	duration := int32(60)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceSystem},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: &duration,
			RenewTime:            &metav1.MicroTime{Time: renewed},
		},
	}
}

func holderOf(t *testing.T, c *fake.Clientset, name string) string {
	t.Helper()
	l, err := c.CoordinationV1().Leases(metav1.NamespaceSystem).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return *l.Spec.HolderIdentity
}

// A restarted server frees the leases its earlier run held, once they have
// gone unrenewed, and never those of another machine; nor one held under
// its hostname that is renewed meanwhile: another server with the same
// hostname leads there (CI: freeing it made that server's controller-manager
// lose the lead and kelp exit).
func TestReleaseOwnLeases(t *testing.T) {
	const gone = 300 * time.Millisecond
	now := time.Now()
	c := fake.NewClientset(
		leaderLease("kube-controller-manager", "vm_1111", now.Add(-time.Minute)), // the earlier run, long gone
		leaderLease("kube-scheduler", "other_2222", now.Add(-time.Minute)),       // another machine's
	)
	if err := releaseOwnLeases(context.Background(), c, "vm", gone); err != nil {
		t.Fatal(err)
	}
	if got := holderOf(t, c, "kube-controller-manager"); got != "" {
		t.Errorf("the earlier run's lease is still held by %q", got)
	}
	if got := holderOf(t, c, "kube-scheduler"); got != "other_2222" {
		t.Errorf("another machine's lease: holder %q, want other_2222", got)
	}

	// Renewed just now, under this hostname: it waits for gone, sees a
	// renewal and leaves the lease alone.
	leases := c.CoordinationV1().Leases(metav1.NamespaceSystem)
	live := leaderLease("kube-scheduler", "vm_3333", time.Now())
	if _, err := leases.Update(context.Background(), live, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	renewer := time.AfterFunc(gone/2, func() {
		if _, err := leases.Update(context.Background(), leaderLease("kube-scheduler", "vm_3333", time.Now()), metav1.UpdateOptions{}); err != nil {
			t.Error(err)
		}
	})
	defer renewer.Stop()
	if err := releaseOwnLeases(context.Background(), c, "vm", gone); err != nil {
		t.Fatal(err)
	}
	if got := holderOf(t, c, "kube-scheduler"); got != "vm_3333" {
		t.Errorf("a lease renewed by a live process was freed: holder %q", got)
	}

	// Not renewed in gone: the holder is gone, and the lease is freed.
	if err := releaseOwnLeases(context.Background(), c, "vm", gone); err != nil {
		t.Fatal(err)
	}
	if got := holderOf(t, c, "kube-scheduler"); got != "" {
		t.Errorf("a lease unrenewed for %s is still held by %q", gone, got)
	}
}
