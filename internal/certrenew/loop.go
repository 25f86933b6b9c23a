package certrenew

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/pki"
)

var log = logrus.WithField("component", "certrenew")

// Loop keeps Leaves renewed: it calls Renew once the first of them is
// due, and otherwise looks again when it will be, at least hourly in case
// the clock jumped. A renewal that fails is tried again, sooner as expiry
// nears; it never stops the loop, since the old leaves still work.
type Loop struct {
	Leaves []pki.Pair
	Renew  func(context.Context) error
}

// Run runs the loop until ctx ends.
func (l Loop) Run(ctx context.Context) error {
	failures := 0
	for {
		next := pki.NextExpiry(l.Leaves)
		if !time.Now().Before(next.RenewAt) {
			err := l.Renew(ctx)
			if ctx.Err() != nil {
				return nil
			}
			next = pki.NextExpiry(l.Leaves)
			switch {
			case err != nil:
				failures++
				log.WithError(err).Warnf("renewing certificates failed; trying again in %s", wait(time.Now(), next, failures))
			case !time.Now().Before(next.RenewAt):
				// Renewed, and due still: a leaf cannot outlive its
				// CA, so one near the CA's end stays due.
				failures++
			default:
				failures = 0
			}
		}
		d := wait(time.Now(), next, failures)
		log.WithFields(logrus.Fields{"cert": next.Cert, "due": next.RenewAt}).Debugf("next look at the certificates in %s", d)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
	}
}

const (
	// maxWait bounds every wait: a wall clock that jumped, or a machine
	// that slept, is noticed within it.
	maxWait = time.Hour
	// firstRetry is the wait after the first failed renewal; it doubles
	// with each failure after.
	firstRetry = 5 * time.Second
	minWait    = time.Second
)

// wait is how long the loop sleeps before it looks at next again, after
// failures renewals in a row that left it due.
func wait(now time.Time, next pki.Expiry, failures int) time.Duration {
	if until := next.RenewAt.Sub(now); until > 0 {
		return min(max(until, minWait), maxWait)
	}
	retry := firstRetry << min(max(failures-1, 0), 10)
	// Before expiry, a tenth of the time left bounds the wait: the loop
	// tries several times more before the old leaf stops working.
	if left := next.NotAfter.Sub(now); left > 0 {
		retry = min(retry, left/10)
	}
	return min(max(retry, minWait), maxWait)
}
