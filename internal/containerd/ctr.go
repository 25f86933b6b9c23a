package containerd

import (
	ctrapp "github.com/containerd/containerd/v2/cmd/ctr/app"
	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/layout"
)

// CtrMain runs ctr with args, talking to kelp's containerd unless
// --address or CONTAINERD_ADDRESS says otherwise.
func CtrMain(args []string) error {
	app := ctrapp.New()
	for _, f := range app.Flags {
		if sf, ok := f.(*cli.StringFlag); ok && sf.Name == "address" {
			sf.Value = layout.ContainerdAddress
		}
	}
	return app.Run(args)
}
