package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// runMigrate parses a command line of kelp datastore migrate's target.
func runMigrate(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var in MigrateInput
	var got string
	app := &cli.App{
		Name: "kelp",
		Commands: []*cli.Command{{
			Name:  "migrate",
			Flags: MigrateFlags(&in),
			Action: func(*cli.Context) error {
				to, err := in.Target()
				got = to
				return err
			},
		}},
	}
	return got, app.Run(append([]string{"kelp", "migrate"}, args...))
}

// TestMigrateTarget: an endpoint with a password can be given without
// putting it on the command line, in a file or the environment.
func TestMigrateTarget(t *testing.T) {
	const endpoint = "postgres://kelp:s3cret@db:5432/kelp"
	file := writeFile(t, filepath.Join(t.TempDir(), "to"), endpoint+"\n")
	if got, err := runMigrate(t, "--to", "etcd"); err != nil || got != "etcd" {
		t.Errorf("--to etcd: %q, %v", got, err)
	}
	if got, err := runMigrate(t, "--to-file", file); err != nil || got != endpoint {
		t.Errorf("--to-file: %q, %v", got, err)
	}
	if _, err := runMigrate(t, "--to", "sqlite", "--to-file", file); err == nil || !strings.Contains(err.Error(), "exclude each other") {
		t.Errorf("--to and --to-file: %v, want them refused together", err)
	}
	if _, err := runMigrate(t); err == nil || !strings.Contains(err.Error(), "KELP_MIGRATE_TO") {
		t.Errorf("no target: %v, want an error naming every way to give it", err)
	}
	t.Setenv("KELP_MIGRATE_TO", endpoint)
	if got, err := runMigrate(t); err != nil || got != endpoint {
		t.Errorf("KELP_MIGRATE_TO: %q, %v", got, err)
	}
	t.Setenv("KELP_MIGRATE_TO", "")
	t.Setenv("KELP_MIGRATE_TO_FILE", file)
	if got, err := runMigrate(t); err != nil || got != endpoint {
		t.Errorf("KELP_MIGRATE_TO_FILE: %q, %v", got, err)
	}
}
