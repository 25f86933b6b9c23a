package killall

import (
	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/logging"
)

// Command is `kelp killall`: the node it stops is named as every command
// names its node (config.NodeFlags).
func Command() *cli.Command {
	return command(Run)
}

// command is Command with run stopping the node of a data dir.
func command(run func(dataDir string) error) *cli.Command {
	return &cli.Command{
		Name:  "killall",
		Usage: "stop kelp and every container it started, unmount its filesystems, remove its interfaces and nftables tables",
		Flags: config.NodeFlags(),
		Action: config.WithDataDir(func(_ *cli.Context, dataDir string) error {
			logging.Setup(false)
			return run(dataDir)
		}),
	}
}
