package config

import (
	"errors"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/token"
)

// MigrateInput is the target of `kelp datastore migrate` as given. Its
// zero value is ready for MigrateFlags.
type MigrateInput struct{ to, toFile string }

// MigrateFlags are the flags that name the migration's target, bound to
// in. A target endpoint may hold a password, which every user of the
// machine reads on a command line: --to-file and KELP_MIGRATE_TO keep it
// off.
func MigrateFlags(in *MigrateInput) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "to", EnvVars: []string{"KELP_MIGRATE_TO"}, Destination: &in.to,
			Usage: "where the cluster goes: sqlite, etcd (embedded), or a --datastore-endpoint (postgres://…, mysql://…, https://… for an external etcd); one with a password goes in --to-file or KELP_MIGRATE_TO"},
		&cli.StringFlag{Name: "to-file", EnvVars: []string{"KELP_MIGRATE_TO_FILE"}, Destination: &in.toFile,
			Usage: "file holding --to's value, which then stays out of the process list"},
	}
}

// Target is where the cluster goes: sqlite, etcd or an endpoint.
func (in MigrateInput) Target() (string, error) {
	to, err := token.FromFlagOrFile("to", in.to, "to-file", in.toFile)
	if err == nil && to == "" {
		err = errors.New("say where the cluster goes: --to sqlite, --to etcd, or an endpoint (with a password: in --to-file FILE or KELP_MIGRATE_TO)")
	}
	return to, err
}
