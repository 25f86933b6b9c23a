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
	schedulerconfig "k8s.io/kubernetes/cmd/kube-scheduler/app/config"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	kubescheduler "k8s.io/kubernetes/pkg/scheduler"

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
		// As the controller-manager's (controllermanager.Args): no lookup
		// of client CAs for a port kelp only probes.
		"authentication-skip-lookup": "true",
		"profiling":                  "false",
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
	var lock *electionLock
	if cc.LeaderElection != nil {
		lock = newElectionLock(cc.LeaderElection.Lock)
		cc.LeaderElection.Lock = lock
	}
	healthz := "https://127.0.0.1:" + securePort + "/healthz"
	return component.Go("kube-scheduler", func(ctx context.Context) error {
		return run(ctx, cc, sched, lock)
	}, component.ReadyWhen(component.GetOK(healthz, &tls.Config{InsecureSkipVerify: true}))), nil
}

// run runs the scheduler until ctx ends, then stops it. With leader
// election (lock), a leader stops scheduling and releases its lease, and a
// standby can no longer lead; either is then left to end with the process,
// which it would otherwise exit (see electionLock).
func run(ctx context.Context, cc *schedulerconfig.CompletedConfig, sched *kubescheduler.Scheduler, lock *electionLock) error {
	if lock == nil {
		err := app.Run(ctx, cc, sched)
		if ctx.Err() != nil {
			return nil // it says it finished, as asked
		}
		return err
	}
	electing, cancel := context.WithCancel(context.Background())
	exited := make(chan error, 1)
	go func() { exited <- app.Run(electing, cc, sched) }()
	select {
	case err := <-exited:
		cancel()
		return err
	case <-ctx.Done():
	}
	if lock.stop(cancel) {
		select {
		case <-lock.parked:
		case err := <-exited:
			return err
		}
	}
	return nil
}
