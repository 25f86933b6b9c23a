package scheduler

import (
	"context"
	"crypto/tls"
	"fmt"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/cli/globalflag"
	"k8s.io/component-base/logs"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/kubeargs"
)

// securePort is where the scheduler serves /healthz, on loopback.
const securePort = "10259"

// Config is what the scheduler's flags are built from.
type Config struct {
	Kubeconfig string
	// LeaderElection is off where no second server can share the
	// datastore (SQLite).
	LeaderElection bool
	ExtraArgs      []string
}

// Args returns the kube-scheduler command line for cfg.
func Args(cfg Config) []string {
	return kubeargs.Render(kubeargs.WithLeaderElection(map[string]string{
		"kubeconfig":                cfg.Kubeconfig,
		"authentication-kubeconfig": cfg.Kubeconfig,
		"authorization-kubeconfig":  cfg.Kubeconfig,
		"bind-address":              "127.0.0.1",
		"secure-port":               securePort,
		"profiling":                 "false",
	}, cfg.LeaderElection), cfg.ExtraArgs)
}

// Start parses the flags Args(cfg) the way the kube-scheduler command does
// and runs it (see apiserver.Start for why not the cobra command). It is
// ready once its /healthz answers ok (self-signed, loopback only).
func Start(cfg Config) (*component.Running, error) {
	opts := options.NewOptions()
	fs := pflag.NewFlagSet("kube-scheduler", pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	globalflag.AddGlobalFlags(opts.Flags.FlagSet("global"), "kube-scheduler", logs.SkipLoggingConfigurationFlags())
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	args := Args(cfg)
	kubeargs.Log("kube-scheduler", args)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-scheduler flags: %w (check --kube-scheduler-arg)", err)
	}
	if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, fmt.Errorf("kube-scheduler feature gates: %w", err)
	}
	// The scheduler keeps what Setup builds, so it gets no deadline.
	cc, sched, err := app.Setup(context.Background(), opts)
	if err != nil {
		return nil, fmt.Errorf("kube-scheduler setup: %w", err)
	}
	healthz := "https://127.0.0.1:" + securePort + "/healthz"
	return component.Go("kube-scheduler", func(ctx context.Context) error {
		return app.Run(ctx, cc, sched)
	},
		component.ReadyWhen(component.GetOK(healthz, &tls.Config{InsecureSkipVerify: true})),
		// It exits the process when its context ends while it leads, so
		// it is never cancelled: it ends with the process, after the
		// apiserver and the datastore have stopped.
		component.LeaveRunning()), nil
}
