package containerd

import (
	"github.com/containerd/containerd/v2/cmd/containerd/command"
	ctrapp "github.com/containerd/containerd/v2/cmd/ctr/app"
	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/layout"
)

// Main runs containerd with args (args[0] is the program name).
func Main(args []string) error {
	return command.App().Run(args)
}

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
