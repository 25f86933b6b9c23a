package snapshot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/nodeevent"
)

var log = logrus.WithField("component", "snapshot")

// ScheduleConfig is what Schedule needs.
type ScheduleConfig struct {
	Snapshots config.Snapshots
	DataDir   string
	// Node names the scheduled snapshots, kelp-snapshot-<node>-<time>, and
	// so tells apart those of servers that share an S3 folder.
	Node string
	// Events, if not nil, is where a failed upload is recorded as an
	// Event on the Node, besides the log.
	Events kubernetes.Interface
}

// EventComponent is the source of the Events about snapshots.
const EventComponent = "kelp-snapshot"

// ReasonUploadFailed is the reason of the Warning Event on the server's
// Node when a snapshot could not be copied to S3.
const ReasonUploadFailed = "SnapshotUploadFailed"

// warnUploadFailed records on the Node of the server that saved the
// snapshot meta that its upload failed with err. The message names the
// snapshot, where it is kept and the S3 location and endpoint; err says
// what failed in words that hold no secret (remote.explain names the
// flags, never their values).
func warnUploadFailed(ctx context.Context, events kubernetes.Interface, node string, cfg config.S3, meta Metadata, dir string, err error) {
	if events == nil {
		return
	}
	message := fmt.Sprintf("snapshot %s is kept in %s, but copying it to %s at %s failed: %v", meta.Name, dir, cfg.Location(), cfg.Endpoint, err)
	if err := nodeevent.Warning(ctx, events, node, EventComponent, ReasonUploadFailed, message); err != nil {
		log.WithError(err).Debug("could not record the failed upload on the node")
	}
}

// base is what the time follows in the names of the scheduled snapshots
// of this node, the only ones the schedule prunes.
func (c ScheduleConfig) base() string {
	return DefaultName + "-" + c.Node
}

// Schedule takes a snapshot at each time of c.Snapshots.Schedule until
// ctx ends. Each snapshot is copied to S3 if configured; then the
// Retention newest scheduled snapshots of this node are kept, in the
// snapshot directory and on S3 each. A run that fails is logged and the
// next one comes at the next time: a missed snapshot must not stop the
// server. It returns nil once ctx ends.
func Schedule(ctx context.Context, c ScheduleConfig) error {
	if c.Snapshots.Schedule == nil || c.Node == "" {
		return errors.New("scheduled snapshots need a schedule and a node name: the server's configuration was not parsed")
	}
	for {
		next := c.Snapshots.Schedule.Next(time.Now())
		if next.IsZero() {
			return errors.New("the snapshot schedule has no next time: fix --snapshot-schedule-cron")
		}
		log.WithField("at", next.Format(time.RFC3339)).Debug("next snapshot")
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		if err := c.run(ctx); err != nil && ctx.Err() == nil {
			log.WithError(err).Errorf("scheduled snapshot failed; the next is due at %s", c.Snapshots.Schedule.Next(time.Now()).Format(time.RFC3339))
		}
	}
}

// run takes one scheduled snapshot, keeps it locally, copies it and those
// taken while S3 was down to S3, and prunes. While S3 fails, no local
// snapshot is pruned: they may be the only copies.
func (c ScheduleConfig) run(ctx context.Context) error {
	d := Dir{DataDir: c.DataDir, Path: c.Snapshots.Dir, Node: c.Node}
	meta, err := d.Save(ctx, DefaultName)
	if err != nil {
		return err
	}
	taken := log.WithFields(logrus.Fields{"name": meta.Name, "bytes": meta.Size, "dir": d.path()})
	sel := selection{base: c.base(), node: c.Node, keep: meta.Name}
	if c.Snapshots.S3 == nil {
		taken.Info("snapshot taken")
		pruned, err := d.prune(c.Snapshots.Retention, sel)
		logPruned(pruned, d.path())
		return err
	}
	r, uploaded, err := d.offsite(ctx, *c.Snapshots.S3, meta)
	if slices.Contains(uploaded, meta.Name) {
		taken = taken.WithField("s3", r.location(meta.Name))
	}
	taken.Info("snapshot taken")
	for _, name := range uploaded {
		if name != meta.Name {
			log.WithFields(logrus.Fields{"name": name, "s3": r.location(name)}).Info("uploaded a snapshot taken while S3 could not be reached")
		}
	}
	if err != nil {
		warnUploadFailed(ctx, c.Events, c.Node, *c.Snapshots.S3, meta, d.path(), err)
		return fmt.Errorf("copy snapshot %s to S3: %w; it is kept in %s, and no snapshot is pruned until a copy succeeds", meta.Name, err, d.path())
	}
	pruned, err := prune(ctx, r, c.Snapshots.Retention, sel)
	if err != nil {
		return fmt.Errorf("prune snapshots in %s: %w; no local snapshot is pruned until S3 works again", r.cfg.Location(), err)
	}
	logPruned(pruned, r.cfg.Location())
	pruned, err = d.prune(c.Snapshots.Retention, sel)
	logPruned(pruned, d.path())
	return err
}

func logPruned(names []string, where string) {
	for _, name := range names {
		log.WithFields(logrus.Fields{"name": name, "from": where}).Debug("pruned snapshot")
	}
}

// SaveOffsite takes a snapshot as Save does and keeps it locally; then,
// with s3, copies it to S3, as a scheduled one is copied, with this
// node's snapshots saved while S3 was down. An S3 that fails costs the
// snapshot nothing: the failure is logged, the local snapshot kept, and the
// next save that reaches S3 uploads it.
func (d Dir) SaveOffsite(ctx context.Context, name string, s3 *config.S3) (Metadata, error) {
	meta, err := d.Save(ctx, name)
	if err != nil {
		return Metadata{}, err
	}
	taken := log.WithFields(logrus.Fields{"name": meta.Name, "bytes": meta.Size, "dir": d.path()})
	if s3 == nil {
		taken.Info("snapshot taken")
		return meta, nil
	}
	r, uploaded, err := d.offsite(ctx, *s3, meta)
	if slices.Contains(uploaded, meta.Name) {
		taken = taken.WithField("s3", r.location(meta.Name))
	}
	taken.Info("snapshot taken")
	if err != nil {
		log.WithError(err).Warnf("snapshot %s is kept in %s, but copying it to %s failed; the next snapshot saved while S3 answers copies it", meta.Name, d.path(), s3.Location())
	}
	return meta, nil
}
