package certrenew

import (
	"time"

	"k8s.io/client-go/transport"
)

// SpeedUpClientReload makes client-go look for changed client certificate
// files often enough for leaves renewed window before they expire: a
// client keeps a connection it opened with the old certificate until it
// looks, and the apiserver refuses that certificate once it expired.
// Upstream looks every five minutes, plenty for a year-long leaf renewed
// with 120 days left, so this changes something only for a test's
// minutes-long leaves.
//
// It sets a process-wide variable of client-go, which each client reads
// when it is made: call it once, before the clients that should follow.
func SpeedUpClientReload(window time.Duration) {
	if window <= 0 {
		return
	}
	if period := max(window/6, time.Second); period < transport.CertCallbackRefreshDuration {
		transport.CertCallbackRefreshDuration = period
	}
}
