package bootguard

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/layout"
)

// Command is `kelp upgrade`: what the boot guard does, by hand.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "upgrade",
		Usage: "act on an upgrade of this node's kelp",
		Subcommands: []*cli.Command{{
			Name: "rollback",
			Usage: "roll a stopped node back from an upgrade that has not become ready, as the boot guard does: kelp.previous takes the place of this kelp, " +
				"and a single server's datastore that the new kelp opened is restored from the snapshot taken before the upgrade",
			Flags: config.NodeFlags(),
			Action: func(c *cli.Context) error {
				if c.Args().Present() {
					return fmt.Errorf("kelp upgrade rollback takes no arguments, got %q", c.Args().Slice())
				}
				dataDir, err := config.DataDir(c)
				if err != nil {
					return err
				}
				binary, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find this kelp's file: %w", err)
				}
				done, err := rollbackStopped(dataDir, binary)
				for _, step := range done.Steps {
					fmt.Fprintln(c.App.Writer, step)
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(c.App.Writer, "rolled the node of %s back from %s to %s: start kelp again (systemctl start kelp)\n", dataDir, describe(done.Upgrade.To), describe(done.Upgrade.From))
				return nil
			},
		}},
	}
}

// rollbackStopped rolls back the upgrade on trial on the stopped node of
// dataDir.
func rollbackStopped(dataDir, binary string) (Done, error) {
	if _, err := os.Stat(dataDir); err != nil {
		return Done{}, fmt.Errorf("data dir: %w: give the node's --data-dir", err)
	}
	release, err := Lock(dataDir, "upgrade rollback")
	if err != nil {
		return Done{}, fmt.Errorf("%w: a node is rolled back while it is stopped (systemctl stop kelp)", err)
	}
	defer release()
	rec, err := load(layout.BootGuard(dataDir))
	if err != nil {
		return Done{}, err
	}
	if rec.Upgrade == nil {
		last := "no kelp has become ready on it under the boot guard"
		if rec.Ready != nil {
			last = describe(*rec.Ready) + " became ready on it last"
		}
		return Done{}, fmt.Errorf("no upgrade of the node of %s is on trial (%s), so there is nothing to roll back: "+
			"to leave a kelp that became ready, put the earlier binary back by hand and restore the snapshot taken before the upgrade (kelp snapshot ls shows pre-upgrade-* snapshots)", dataDir, last)
	}
	return Rollback(dataDir, binary, *rec.Upgrade)
}
