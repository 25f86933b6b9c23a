package scheduler

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// elector is client-go's leader elector on an electionLock over a fake
// Lease, with the callbacks upstream's scheduler has in the places that
// matter: it exits the process when its election ends (here: closes
// exited).
type elector struct {
	client  *fake.Clientset
	lock    *electionLock
	reads   chan struct{} // a read of the Lease by the elector
	leading chan struct{}
	exited  chan struct{}
	cancel  context.CancelFunc
}

func startElector(t *testing.T, lease *coordinationv1.Lease) *elector {
	t.Helper()
	client := fake.NewClientset()
	if lease != nil {
		if _, err := client.CoordinationV1().Leases("kube-system").Create(context.Background(), lease, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e := &elector{client: client, reads: make(chan struct{}, 100), leading: make(chan struct{}), exited: make(chan struct{})}
	e.lock = newElectionLock(&countingLock{
		Interface: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-scheduler"},
			Client:     client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: "server1_1234"},
		},
		reads: e.reads,
	})
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            e.lock,
		LeaseDuration:   60 * time.Second,
		RenewDeadline:   40 * time.Second,
		RetryPeriod:     20 * time.Millisecond,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(e.leading) },
			OnStoppedLeading: func() { close(e.exited) },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ctx context.Context
	ctx, e.cancel = context.WithCancel(context.Background())
	go le.Run(ctx)
	return e
}

func (e *elector) holder(t *testing.T) string {
	t.Helper()
	lease, err := e.client.CoordinationV1().Leases("kube-system").Get(context.Background(), "kube-scheduler", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// countingLock tells of every read of the record.
type countingLock struct {
	resourcelock.Interface
	reads chan struct{}
}

func (c *countingLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	defer func() { c.reads <- struct{}{} }()
	return c.Interface.Get(ctx)
}

func TestStopLeaderReleasesLease(t *testing.T) {
	e := startElector(t, nil)
	<-e.leading
	if h := e.holder(t); h != "server1_1234" {
		t.Fatalf("holder %q, want the elector", h)
	}
	if !e.lock.stop(e.cancel) {
		t.Fatal("stop: a leader said it was not leading")
	}
	select {
	case <-e.lock.parked:
	case <-e.exited:
		t.Error("the elector went on to exit the process")
	}
	if h := e.holder(t); h != "" {
		t.Errorf("holder %q after stop, want the lease released", h)
	}
}

func TestStopStandbyNeverLeads(t *testing.T) {
	other, now, duration := "server2_5678", metav1.NewMicroTime(time.Now()), int32(60)
	e := startElector(t, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-scheduler"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &other, LeaseDurationSeconds: &duration, AcquireTime: &now, RenewTime: &now},
	})
	<-e.reads
	if e.lock.stop(e.cancel) {
		t.Fatal("stop: a standby said it was leading")
	}
	t.Cleanup(e.cancel)
	// The leader releases its lease: the stopped standby must not take it.
	lease, err := e.client.CoordinationV1().Leases("kube-system").Get(context.Background(), "kube-scheduler", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	empty := ""
	lease.Spec.HolderIdentity = &empty
	if _, err := e.client.CoordinationV1().Leases("kube-system").Update(context.Background(), lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Three reads after the release, the first of which may have begun
	// before it: an attempt to take the lease, which follows a read, is
	// over.
	for len(e.reads) > 0 {
		<-e.reads
	}
	for range 3 {
		select {
		case <-e.reads:
		case <-e.leading:
			t.Fatal("a stopped standby started leading")
		case <-e.exited:
			t.Fatal("a stopped standby exited the process")
		}
	}
	if h := e.holder(t); h != "" {
		t.Errorf("holder %q: a stopped standby took the lease", h)
	}
}
