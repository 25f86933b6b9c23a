package datastore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Compaction frees space inside etcd's bbolt file but never shrinks it, and
// etcd's quota counts the file: a cluster that once churned through many
// objects keeps the file, and comes closer to going read-only, until the
// member is defragmented. Defragmenting rewrites the file and blocks the
// member's reads and writes meanwhile, about a second per 100 MiB, so it
// runs only when worth it, one member at a time, and not while busy.
const (
	// defragInterval is how often a member checks, with a quarter of it as
	// jitter either way so that members that started together drift apart.
	defragInterval = 6 * time.Hour
	// defragRetry is the wait after a check that found the cluster busy or
	// another member defragmenting, also with a quarter of it as jitter.
	defragRetry = 15 * time.Minute
	// A member is defragmented when more than defragMinShare of its file
	// is free and that is at least defragMinFree bytes.
	defragMinShare = 0.5
	defragMinFree  = 32 << 20
	// The cluster is busy when more than busyWrites revisions are made in
	// quietWindow; a member defers defragmenting at most maxDeferrals
	// times, so that a cluster that is never quiet still gets it.
	quietWindow  = 10 * time.Second
	busyWrites   = 100
	maxDeferrals = 8
	// defragTimeout bounds the wait for a member's defragmentation; the
	// lock outlives it so that no other member starts while it may still run.
	defragTimeout = 10 * time.Minute
	defragLockTTL = 15 * time.Minute
	// defragLockKey is held, under a lease, by the member that defragments.
	// A lease rather than a session: a session's keepalives go through the
	// member being defragmented, which does not answer meanwhile.
	defragLockKey = "/kelp/defrag"
)

// errDefragDeferred says why a check did not defragment when it should
// have: the next check comes sooner.
var errDefragDeferred = errors.New("defragmentation deferred")

// Defrag keeps the embedded etcd member that be reaches defragmented: every
// 6 hours or so it compares the member's file with the space in use and,
// when more than half of it is free, defragments the member, holding the
// cluster-wide lock /kelp/defrag meanwhile. It runs until ctx ends and then
// returns nil; a failed check is logged and tried again later.
func Defrag(ctx context.Context, be Backend) error {
	if be.Kind != KindEtcd || len(be.Endpoints) != 1 {
		return fmt.Errorf("defragmentation is for an embedded etcd member, not a %s datastore with endpoints %v", be.Kind, be.Endpoints)
	}
	cli, err := newClient(be)
	if err != nil {
		return fmt.Errorf("etcd client for defragmentation: %w", err)
	}
	defer cli.Close()
	d := &defragger{
		cli:      cli,
		endpoint: be.Endpoints[0],
		log:      logrus.WithField("component", "etcd-defrag"),
		minShare: defragMinShare,
		minFree:  defragMinFree,
		quiet:    quietWindow,
	}
	d.run(ctx)
	return nil
}

type defragger struct {
	cli      *clientv3.Client
	endpoint string // the local member's client URL
	log      *logrus.Entry
	minShare float64
	minFree  int64
	quiet    time.Duration
}

func (d *defragger) run(ctx context.Context) {
	wait := jitter(defragInterval)
	deferrals := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		_, err := d.check(ctx, deferrals >= maxDeferrals)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errDefragDeferred):
			deferrals++
			d.log.WithError(err).Debug("etcd defragmentation deferred")
			wait = jitter(defragRetry)
			continue
		case err != nil:
			d.log.WithError(err).Warn("etcd defragmentation check failed; trying again later")
		}
		deferrals = 0
		wait = jitter(defragInterval)
	}
}

// jitter returns d plus or minus up to a quarter of d.
func jitter(d time.Duration) time.Duration {
	return d - d/4 + rand.N(d/2)
}

// check defragments the member if it is fragmented enough, the cluster is
// quiet (unless evenIfBusy) and no other member is defragmenting. It
// reports whether it did.
func (d *defragger) check(ctx context.Context, evenIfBusy bool) (bool, error) {
	before, err := d.status(ctx)
	if err != nil {
		return false, err
	}
	free := before.DbSize - before.DbSizeInUse
	if free < d.minFree || float64(free) <= d.minShare*float64(before.DbSize) {
		d.log.Debugf("etcd member needs no defragmentation: %s of %s in use", mib(before.DbSizeInUse), mib(before.DbSize))
		return false, nil
	}
	if !evenIfBusy {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(d.quiet):
		}
		now, err := d.status(ctx)
		if err != nil {
			return false, err
		}
		if writes := now.Header.Revision - before.Header.Revision; writes > busyWrites {
			return false, fmt.Errorf("%w: %d writes in %s", errDefragDeferred, writes, d.quiet)
		}
	}

	member := strconv.FormatUint(before.Header.MemberId, 16)
	release, err := d.lock(ctx, member)
	if err != nil {
		return false, err
	}
	defer release()

	began := time.Now()
	dctx, cancel := context.WithTimeout(ctx, defragTimeout)
	_, err = d.cli.Defragment(dctx, d.endpoint)
	cancel()
	if err != nil {
		return false, fmt.Errorf("defragment etcd member %s: %w", member, err)
	}
	after, err := d.status(ctx)
	if err != nil {
		return true, err
	}
	d.log.Infof("Defragmented etcd member %s in %s: its file went from %s to %s", member, time.Since(began).Round(time.Millisecond), mib(before.DbSize), mib(after.DbSize))
	return true, nil
}

func (d *defragger) status(ctx context.Context) (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, probeAttemptTimeout)
	defer cancel()
	st, err := d.cli.Status(ctx, d.endpoint)
	if err != nil {
		return nil, fmt.Errorf("status of etcd member %s: %w", d.endpoint, err)
	}
	return st, nil
}

// lock takes defragLockKey for member under a lease that expires on its own
// if this member dies while defragmenting. It returns errDefragDeferred
// while another member holds it.
func (d *defragger) lock(ctx context.Context, member string) (release func(), err error) {
	ctx, cancel := context.WithTimeout(ctx, probeAttemptTimeout)
	defer cancel()
	lease, err := d.cli.Grant(ctx, int64(defragLockTTL/time.Second))
	if err != nil {
		return nil, fmt.Errorf("lease for %s: %w", defragLockKey, err)
	}
	revoke := func() {
		ctx, cancel := context.WithTimeout(context.Background(), probeAttemptTimeout)
		defer cancel()
		if _, err := d.cli.Revoke(ctx, lease.ID); err != nil {
			d.log.WithError(err).Warnf("release %s; it expires within %s", defragLockKey, defragLockTTL)
		}
	}
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(defragLockKey), "=", 0)).
		Then(clientv3.OpPut(defragLockKey, member, clientv3.WithLease(lease.ID))).
		Else(clientv3.OpGet(defragLockKey)).
		Commit()
	if err != nil {
		revoke()
		return nil, fmt.Errorf("take %s: %w", defragLockKey, err)
	}
	if !resp.Succeeded {
		revoke()
		holder := "another member"
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			holder = "member " + string(kvs[0].Value)
		}
		return nil, fmt.Errorf("%w: %s is defragmenting", errDefragDeferred, holder)
	}
	return revoke, nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
