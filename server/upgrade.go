package server

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/agent"
	"github.com/kelp-dev/kelp/internal/bootguard"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/snapshot"
	"github.com/kelp-dev/kelp/internal/version"
)

// membersTimeout bounds the question to the local etcd member of how many
// members the cluster has.
const membersTimeout = 10 * time.Second

// beginGuard counts this start with the boot guard. The record of a kelp
// without the guard, versions.json, says what ran before.
func beginGuard(cfg config.Server) (*bootguard.Guard, error) {
	if os.Geteuid() != 0 {
		return nil, errNotRoot
	}
	if err := agent.CheckWritable(cfg.DataDir); err != nil {
		return nil, err
	}
	return bootguard.BeginHere(cfg.DataDir, "server", cfg.UpgradeAttempts)
}

// An upgrade's snapshot is taken where the datastore can be read and the
// new kelp has written nothing of Kubernetes to it: the apiserver, which
// stores objects in its own versions, starts only once the snapshot is
// recorded. SQLite is copied before kine opens the database (a newer kine
// may change its schema), as kelp snapshot save copies a stopped server's.
// An embedded etcd snapshot is streamed by a running member, so it is
// taken once the member is ready (snapshotEtcd): by then the member has
// written etcd's own records only, and in HA what the other members
// replicate to it.

// beforeDatastore is called before the new kelp opens the datastore,
// which the data dir holds of the kind local (datastore.LocalKind): it
// takes the SQLite snapshot and records that the datastore is opened.
func beforeDatastore(ctx context.Context, cfg config.Server, guard *bootguard.Guard, local string) error {
	up := guard.Upgrade()
	if up == nil {
		return nil
	}
	if cfg.Datastore.Endpoint != "" {
		if !up.Touched {
			log.Info("No snapshot before the upgrade: the datastore is external (--datastore-endpoint); " +
				"back it up with its own tools (pg_dump, mysqldump, etcdctl snapshot save). A rollback leaves it as it is")
		}
		return guard.Update(func(u *bootguard.Upgrade) { u.Touched, u.Shared = true, true })
	}
	switch local {
	case "":
		// Nothing stored yet: nothing to keep.
		return nil
	case datastore.KindSQLite:
		if !up.Touched && up.Snapshot == nil {
			if err := upgradeSnapshot(ctx, cfg, guard, *up); err != nil {
				return err
			}
		}
	}
	return guard.Update(func(u *bootguard.Upgrade) { u.Touched = true })
}

// snapshotEtcd takes the snapshot of an embedded etcd member once it
// runs, before the apiserver, and records whether other members share it.
func snapshotEtcd(ctx context.Context, cfg config.Server, guard *bootguard.Guard, kind string) error {
	up := guard.Upgrade()
	if up == nil || kind != datastore.KindEtcd || cfg.Datastore.Endpoint != "" || up.Snapshot != nil {
		return nil
	}
	members, err := etcdMembers(ctx, cfg.DataDir)
	if err != nil {
		return fmt.Errorf("before the upgrade from %s to %s: %w", up.From.Kelp, up.To.Kelp, err)
	}
	if err := guard.Update(func(u *bootguard.Upgrade) { u.Shared = members > 1 }); err != nil {
		return err
	}
	return upgradeSnapshot(ctx, cfg, guard, *up)
}

// upgradeSnapshot takes the snapshot of the upgrade up, locally and to S3
// when configured, and records it. Without it the new kelp does not
// start: the guard then rolls back after its starts.
func upgradeSnapshot(ctx context.Context, cfg config.Server, guard *bootguard.Guard, up bootguard.Upgrade) error {
	from, to := upgradeLabels(up.From, up.To)
	d := snapshot.Dir{DataDir: cfg.DataDir, Path: cfg.Snapshots.Dir, Node: cfg.NodeName}
	meta, err := d.SaveOffsite(ctx, snapshot.UpgradeName(from, to), cfg.Snapshots.S3)
	if err != nil {
		return fmt.Errorf("take the snapshot before the upgrade from kelp %s to %s, without which it does not start: %w", up.From.Kelp, up.To.Kelp, err)
	}
	log.WithFields(logrus.Fields{"name": meta.Name, "dir": d.PathOf("")}).Info("Took a snapshot before the upgrade; a rollback restores it")
	return guard.Update(func(u *bootguard.Upgrade) {
		u.Snapshot = &bootguard.Snapshot{
			Name:        meta.Name,
			Path:        d.PathOf(meta.Name),
			Datastore:   meta.Datastore,
			Member:      cfg.NodeName,
			AdvertiseIP: cfg.AdvertiseAddress.String(),
		}
	})
}

// upgradeLabels name the two sides of an upgrade in its snapshot's name:
// the kelp versions, or, when those are the same (builds of one version),
// the Kubernetes versions.
func upgradeLabels(from, to version.Ran) (string, string) {
	if from.Kelp == to.Kelp {
		return from.Kubernetes, to.Kubernetes
	}
	return from.Kelp, to.Kelp
}

// etcdMembers asks the local member how many members its cluster has.
func etcdMembers(ctx context.Context, dataDir string) (int, error) {
	cli, err := datastore.LocalEtcdClient(dataDir)
	if err != nil {
		return 0, fmt.Errorf("connect to embedded etcd: %w", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, membersTimeout)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		return 0, fmt.Errorf("list the embedded etcd members: %w", err)
	}
	return len(resp.Members), nil
}
