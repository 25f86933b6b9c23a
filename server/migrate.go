package server

import (
	"context"
	"fmt"
	"io"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/pki"
)

// MigrateDatastore moves the cluster of the stopped server cfg describes
// into the datastore to names: "sqlite", "etcd" (embedded), or a
// --datastore-endpoint (postgres://, mysql://, https://etcd). It then
// tells the user, on out, what to change in the server's settings.
func MigrateDatastore(ctx context.Context, cfg config.Server, to string, out io.Writer) error {
	local := datastore.LocalKind(cfg.DataDir)
	certs, err := pki.Ensure(pkiConfig(cfg, local))
	if err != nil {
		return err
	}
	from := datastoreConfig(cfg, certs)
	from.ClusterInit = cfg.Datastore.Endpoint == "" && local == datastore.KindEtcd
	target := from
	target.Endpoint, target.CAFile, target.CertFile, target.KeyFile = "", "", "", ""
	target.ClusterInit = false
	if cfg.Datastore.Endpoint == "" {
		// From SQLite or embedded etcd, --datastore-cafile, -certfile
		// and -keyfile are the target's, as the server will run with them.
		from.CAFile, from.CertFile, from.KeyFile = "", "", ""
	}
	var next string
	switch to {
	case "sqlite":
		next = "without --cluster-init, --server and --datastore-endpoint"
	case "etcd":
		target.ClusterInit = true
		next = "with --cluster-init, and without --datastore-endpoint; more servers then join it with --server and the server token"
	default:
		target.Endpoint = to
		if cfg.Datastore.Endpoint == "" {
			target.CAFile, target.CertFile, target.KeyFile = cfg.Datastore.CAFile, cfg.Datastore.CertFile, cfg.Datastore.KeyFile
		}
		next = "with --datastore-endpoint set to the new database, and without --cluster-init and --server"
	}
	if err := target.Validate(); err != nil {
		return fmt.Errorf("--to %s: %w; give sqlite, etcd, or a datastore endpoint (postgres://, mysql://, https:// for an external etcd)", datastore.Redact(to), err)
	}
	m, err := datastore.Migrate(ctx, from, target)
	if err != nil {
		return fmt.Errorf("migrate the datastore: %w", err)
	}
	fmt.Fprintf(out, "migrated %d keys from %s to %s\n", m.Keys, m.From, m.To)
	if m.Kept != "" {
		fmt.Fprintf(out, "the old datastore is kept as %s: remove it once the cluster runs well\n", m.Kept)
	}
	fmt.Fprintf(out, "start kelp server %s\n", next)
	return nil
}

// migrateToEtcd moves a server's own SQLite cluster to embedded etcd when
// it starts with --cluster-init, as its first step towards more servers.
// local is the kind of datastore the data dir holds (datastore.LocalKind).
func migrateToEtcd(ctx context.Context, cfg config.Server, certs pki.Files, local string) error {
	if !cfg.ClusterInit || cfg.JoinServer != "" || local != datastore.KindSQLite {
		return nil
	}
	from := datastoreConfig(cfg, certs)
	from.ClusterInit = false
	m, err := datastore.Migrate(ctx, from, datastoreConfig(cfg, certs))
	if err != nil {
		return fmt.Errorf("--cluster-init on a server with a SQLite datastore moves its cluster to embedded etcd, and that failed (the SQLite datastore is unchanged; start without --cluster-init to use it): %w", err)
	}
	log.WithFields(logrus.Fields{"keys": m.Keys, "kept": m.Kept}).Info("Moved the cluster from SQLite to embedded etcd; remove the kept SQLite file once the cluster runs well")
	return nil
}
