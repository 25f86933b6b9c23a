// Package leader runs a server-side controller on one server at a time:
// the holder of a Lease in kube-system.
package leader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sirupsen/logrus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// The lease is renewed every leaseRetry, a datastore write each time:
// slower than the controller-manager's 2 s, as the work waits a minute
// for a new leader after a server dies without a word.
const (
	leaseDuration = 60 * time.Second
	leaseRenew    = 40 * time.Second
	leaseRetry    = 15 * time.Second
)

// Run runs run while this server holds the Lease, campaigning again
// whenever it loses it, until ctx ends or run fails. Two terms' runs never
// overlap.
//
// leaseName is the Lease; what says what the leader does, for the log.
func Run(ctx context.Context, client kubernetes.Interface, leaseName, what string, run func(context.Context) error) error {
	hostname, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("hostname for the %s lease: %w", leaseName, err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	running := make(chan struct{}, 1) // held by the run of the current term
	config := leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: leaseName, Namespace: metav1.NamespaceSystem},
			Client:     client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: hostname + "_" + string(uuid.NewUUID())},
		},
		Name:            leaseName,
		LeaseDuration:   leaseDuration,
		RenewDeadline:   leaseRenew,
		RetryPeriod:     leaseRetry,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(term context.Context) {
				select {
				case running <- struct{}{}:
				case <-term.Done():
					return
				}
				defer func() { <-running }()
				logrus.WithField("lease", leaseName).Info("leading: this server " + what)
				if err := run(term); err != nil {
					cancel(err)
				}
			},
			OnStoppedLeading: func() {},
		},
	}
	for ctx.Err() == nil {
		elector, err := leaderelection.NewLeaderElector(config)
		if err != nil {
			return fmt.Errorf("leader election for %s: %w", leaseName, err)
		}
		elector.Run(ctx)
	}
	running <- struct{}{} // the last term's run has returned
	if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
