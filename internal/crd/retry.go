package crd

import (
	"context"
	"errors"
	"time"

	"github.com/sirupsen/logrus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The waits of Retry: the first after one failure, doubled after each
// next, never longer than the last.
var retryFirst, retryLongest = time.Second, 30 * time.Second

// Retry calls install until it succeeds, fails for good, or ctx ends. An
// apiserver that is busy or slow (a timeout, 429, 500 or 503, a refused or
// reset connection, a CRD not yet established in time), as on a loaded
// Raspberry Pi or an emulated machine, is waited out and said in the log:
// such a failure must not end kelp, whose service manager would start it
// again into the same slow start. what names the step in the log.
func Retry(ctx context.Context, what string, install func(context.Context) error) error {
	wait := retryFirst
	for {
		err := install(ctx)
		if err == nil || ctx.Err() != nil || !transient(err) {
			return err
		}
		logrus.Warnf("%s: %v; trying again in %s", what, err, wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, retryLongest)
	}
}

// transient says whether err is one a slow or busy apiserver gives, which
// the same request may not give a moment later.
func transient(err error) bool {
	return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) ||
		errors.Is(err, context.DeadlineExceeded) || wait.Interrupted(err) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}
