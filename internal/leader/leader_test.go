package leader

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

const leaseName = "kelp-test"

func TestRunWhileLeading(t *testing.T) {
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	running := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, client, leaseName, "runs the test", func(ctx context.Context) error {
			close(running)
			<-ctx.Done()
			return nil
		})
	}()
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("run did not start with the lease free")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("lead after ctx ended: %v", err)
	}
	lease, err := client.CoordinationV1().Leases(metav1.NamespaceSystem).Get(context.Background(), leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("the lease is still held by %s after a clean stop", *h)
	}
}

func TestRunReturnsRunsFailure(t *testing.T) {
	boom := errors.New("boom")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Run(ctx, fake.NewClientset(), leaseName, "runs the test", func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("lead returned %v, want run's failure", err)
	}
}
