package containerd

import (
	"context"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task/plugin"
	"github.com/containerd/containerd/v2/cmd/containerd/command"
	ctrapp "github.com/containerd/containerd/v2/cmd/ctr/app"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/plugin"
	pluginregistry "github.com/containerd/plugin/registry"
	"github.com/urfave/cli/v2"
)

// Main runs containerd with args (args[0] is the program name).
func Main(args []string) error {
	return command.App().Run(args)
}

// shimTask is the one plugin the shim serves; the shim itself adds the
// event publisher and shutdown plugins it needs.
const shimTask = "io.containerd.ttrpc.v1.task"

// ShimMain runs the runc v2 shim; it parses os.Args itself and exits.
//
// The shim loads every plugin registered in its binary, and this binary
// also holds the containerd daemon's: keep only the shim's task service.
func ShimMain() {
	keep := pluginregistry.Graph(func(r *plugin.Registration) bool { return r.URI() != shimTask })
	pluginregistry.Reset()
	for _, r := range keep {
		pluginregistry.Register(&r)
	}
	shim.RunShim(context.Background(), manager.NewShimManager("io.containerd.runc.v2"))
}

// CtrMain runs ctr with args, talking to kelp's containerd unless
// --address or CONTAINERD_ADDRESS says otherwise.
func CtrMain(args []string) error {
	app := ctrapp.New()
	for _, f := range app.Flags {
		if sf, ok := f.(*cli.StringFlag); ok && sf.Name == "address" {
			sf.Value = Address
		}
	}
	return app.Run(args)
}
