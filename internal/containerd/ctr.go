package containerd

import (
	"context"

	ctrapp "github.com/containerd/containerd/v2/cmd/ctr/app"
	"github.com/urfave/cli/v3"

	"github.com/kelp-dev/kelp/internal/config"
)

// CtrMain runs ctr with args (args[0] is the program name), talking to the
// containerd of the kelp node that a leading --data-dir DIR names (else
// KELP_DATA_DIR, else kelp's config file, else /var/lib/kelp; see
// config.LeadingDataDir), unless --address or CONTAINERD_ADDRESS names
// another.
func CtrMain(args []string) error {
	dataDir, rest, err := config.ToolDataDir(args[1:])
	if err != nil {
		return err
	}
	app := ctrapp.New()
	before := app.Before
	app.Before = func(ctx context.Context, c *cli.Command) (context.Context, error) {
		if !c.IsSet("address") {
			node, err := Find(dataDir)
			if err != nil {
				return ctx, err
			}
			if err := c.Set("address", node.Address()); err != nil {
				return ctx, err
			}
		}
		if before != nil {
			return before(ctx, c)
		}
		return ctx, nil
	}
	return app.Run(context.Background(), append([]string{args[0]}, rest...))
}
