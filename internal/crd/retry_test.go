package crd

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func fastRetries(t *testing.T) {
	first, longest := retryFirst, retryLongest
	retryFirst, retryLongest = time.Millisecond, 4*time.Millisecond
	t.Cleanup(func() { retryFirst, retryLongest = first, longest })
}

// TestRetrySlowAPIServer: the apply of a CRD that timed out on a slow
// machine (found in the VM lab: "apply the CustomResourceDefinition
// tlsroutes…: Timeout" ended kelp) is tried again until it goes through.
func TestRetrySlowAPIServer(t *testing.T) {
	fastRetries(t)
	crds := schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}
	failures := []error{
		fmt.Errorf("apply the CustomResourceDefinition tlsroutes: %w", apierrors.NewTimeoutError("request did not complete within 60s", 0)),
		apierrors.NewServerTimeout(crds, "patch", 1),
		apierrors.NewTooManyRequests("slow down", 1),
		apierrors.NewServiceUnavailable("starting"),
		fmt.Errorf("the CustomResourceDefinition x is not established: %w", context.DeadlineExceeded),
	}
	calls := 0
	err := Retry(context.Background(), "install", func(context.Context) error {
		calls++
		if calls <= len(failures) {
			return failures[calls-1]
		}
		return nil
	})
	if err != nil || calls != len(failures)+1 {
		t.Fatalf("Retry = %v after %d calls, want success after %d", err, calls, len(failures)+1)
	}
}

// TestRetryForGood: an error the same request gives again (a CRD the
// apiserver refuses) ends at once, as does a cancelled context.
func TestRetryForGood(t *testing.T) {
	fastRetries(t)
	invalid := apierrors.NewBadRequest("spec.versions: Required value")
	calls := 0
	err := Retry(context.Background(), "install", func(context.Context) error { calls++; return invalid })
	if !errors.Is(err, invalid) || calls != 1 {
		t.Errorf("Retry = %v after %d calls, want the bad request after one", err, calls)
	}

	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	err = Retry(ctx, "install", func(context.Context) error {
		calls++
		if calls == 3 {
			cancel()
		}
		return apierrors.NewServiceUnavailable("starting")
	})
	if err == nil || calls != 3 {
		t.Errorf("Retry = %v after %d calls, want an error once the context ended (3 calls)", err, calls)
	}
}
