package scheduler

import (
	"context"
	"errors"
	"sync"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

var log = logrus.WithField("component", "kube-scheduler")

// errStopping refuses the lease to a scheduler that kelp has stopped.
var errStopping = errors.New("kelp is stopping this scheduler: it takes no lease")

// electionLock wraps the scheduler's leader election lock so that kelp can
// stop a scheduler without it ending the process. Upstream's scheduler
// exits the process once its leader election ends, leader or not
// (k8s.io/kubernetes/cmd/kube-scheduler/app/server.go, OnStoppedLeading):
// that would end kelp before its apiserver and datastore have stopped. So:
//
//   - A leader is stopped by cancelling its context. Its elector then
//     releases the lease, as client-go does with ReleaseOnCancel (one Get,
//     one Update that empties the holder; leaderelection.go, release), so
//     that another server, or this one restarted, leads at once; the lock
//     lets that Update through and parks the elector for good before it
//     can exit.
//   - A standby's elector makes no call of the lock when its context ends,
//     so a standby is not cancelled: it is left to end with the process,
//     and the lock refuses it the lease from then on.
//
// Calls of the lock take turns with each other and with stop, so the
// holder the lock saw last is the one the elector saw last, which its
// IsLeader is about.
type electionLock struct {
	resourcelock.Interface

	mu       sync.Mutex
	observed string // holder of the record the elector last read or wrote
	state    lockState
	parked   chan struct{} // closed once the elector is parked
}

type lockState int

const (
	electing   lockState = iota
	standingBy           // stopped as a standby: it may not lead any more
	releasing            // stopped as the leader: its next live call is the release
)

func newElectionLock(inner resourcelock.Interface) *electionLock {
	return &electionLock{Interface: inner, parked: make(chan struct{})}
}

// stop stops the elector, once. It says whether the elector leads; if so,
// it has called cancel, the cancel of the elector's context, and the
// elector releases the lease and parks (l.parked). A standby is refused
// the lease from now on.
func (l *electionLock) stop(cancel context.CancelFunc) (leading bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.observed != l.Identity() {
		l.state = standingBy
		return false
	}
	l.state = releasing
	// Under the lock, so that a call waiting for it finds its context
	// ended: a renewal this stop overtook, not the release.
	cancel()
	return true
}

// Get reads the record. On release, it is the read before the Update; if it
// fails, the elector would exit next, so it is parked.
func (l *electionLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	l.mu.Lock()
	if l.state == releasing {
		if err := ctx.Err(); err != nil {
			l.mu.Unlock()
			return nil, nil, err
		}
		record, raw, err := l.Interface.Get(ctx)
		if err == nil {
			l.mu.Unlock()
			return record, raw, nil
		}
		log.WithError(err).Warn("release the scheduler's leader lease: read it; a restarted server waits until it has gone unrenewed")
		l.park()
	}
	record, raw, err := l.Interface.Get(ctx)
	if err == nil {
		l.observed = record.HolderIdentity
	}
	l.mu.Unlock()
	return record, raw, err
}

// Create makes the record, unless the elector is stopped.
func (l *electionLock) Create(ctx context.Context, record resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != electing {
		return errStopping
	}
	if err := l.Interface.Create(ctx, record); err != nil {
		return err
	}
	l.observed = record.HolderIdentity
	return nil
}

// Update writes the record, unless the elector is stopped. On release, it
// is the release, after which the elector is parked.
func (l *electionLock) Update(ctx context.Context, record resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	switch {
	case l.state == releasing && record.HolderIdentity == "" && ctx.Err() == nil:
		if err := l.Interface.Update(ctx, record); err != nil {
			log.WithError(err).Warn("release the scheduler's leader lease; a restarted server waits until it has gone unrenewed")
		}
		l.park()
	case l.state != electing:
		l.mu.Unlock()
		return errStopping
	}
	err := l.Interface.Update(ctx, record)
	if err == nil {
		l.observed = record.HolderIdentity
	}
	l.mu.Unlock()
	return err
}

// park blocks the elector until the process ends: it unlocks l and never
// returns, since what the elector does next is exit the process.
func (l *electionLock) park() {
	close(l.parked)
	l.mu.Unlock()
	select {}
}
