// Command kelp is a Kubernetes distribution in one binary.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/agent"
	"github.com/kelp-dev/kelp/internal/bootguard"
	"github.com/kelp-dev/kelp/internal/certificate"
	"github.com/kelp-dev/kelp/internal/cluster"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/containerd"
	"github.com/kelp-dev/kelp/internal/containerinit"
	"github.com/kelp-dev/kelp/internal/crictl"
	"github.com/kelp-dev/kelp/internal/etcdctl"
	"github.com/kelp-dev/kelp/internal/fleet"
	"github.com/kelp-dev/kelp/internal/hostcheck"
	"github.com/kelp-dev/kelp/internal/killall"
	"github.com/kelp-dev/kelp/internal/kubectl"
	"github.com/kelp-dev/kelp/internal/logging"
	"github.com/kelp-dev/kelp/internal/secretsencrypt"
	"github.com/kelp-dev/kelp/internal/snapshot"
	"github.com/kelp-dev/kelp/internal/tokencmd"
	"github.com/kelp-dev/kelp/internal/version"
	"github.com/kelp-dev/kelp/internal/witness"
	"github.com/kelp-dev/kelp/server"
)

func main() {
	// The entrypoint of a container image (Dockerfile) runs as PID 1.
	if os.Getpid() == 1 {
		os.Exit(containerinit.Run())
	}
	if tool := multicall(os.Args); tool != nil {
		if err := tool(); err != nil {
			fmt.Fprintln(os.Stderr, filepath.Base(os.Args[0])+":", err)
			os.Exit(1)
		}
		return
	}
	for _, w := range config.SecretsOnCommandLine(os.Args) {
		fmt.Fprintln(os.Stderr, "kelp: warning:", w)
	}
	app := newApp()
	args, err := config.WithFileArgs(app, os.Args)
	if err == nil {
		err = app.Run(args)
	}
	// An upgrade from the cluster put a new kelp in place of this one.
	var restart *fleet.RestartError
	if errors.As(err, &restart) {
		if err := fleet.Restart(restart); err != nil {
			fmt.Fprintln(os.Stderr, "kelp:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "kelp:", restart.Error()+": exiting for the service manager to start it")
		os.Exit(1)
	}
	// A new kelp that refuses the flags or config file of the one before
	// fails its start as surely as one whose apiserver does not run.
	err = bootguard.Unstarted(os.Args, err)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kelp:", err)
		os.Exit(1)
	}
}

// multicall returns the tool to run when kelp is started under another
// program's name (a link named kubectl, crictl, ctr or etcdctl).
func multicall(args []string) func() error {
	switch {
	case filepath.Base(args[0]) == "kubectl":
		return func() error { kubectl.Run(args[1:]); return nil }
	case filepath.Base(args[0]) == "crictl":
		return func() error { return crictl.Main(args) }
	case filepath.Base(args[0]) == "ctr":
		return func() error { return containerd.CtrMain(args) }
	case filepath.Base(args[0]) == "etcdctl":
		return func() error { return etcdctl.Main(args) }
	}
	return nil
}

func newApp() *cli.App {
	cli.VersionFlag = &cli.BoolFlag{Name: "version", Usage: "print the versions of kelp and its components"}
	cli.VersionPrinter = func(*cli.Context) { fmt.Print(version.String()) }
	var serverInput config.ServerInput
	var agentInput config.AgentInput
	var migrateInput config.ServerInput
	var migrateTarget config.MigrateInput
	var witnessInput config.WitnessInput
	return &cli.App{
		Name:            "kelp",
		Usage:           "Kubernetes in one binary",
		Version:         version.Version,
		HideHelpCommand: true,
		Commands: []*cli.Command{
			{
				Name:   "server",
				Usage:  "run a control plane and a node",
				Flags:  config.ServerFlags(&serverInput),
				Action: func(c *cli.Context) error { return runServer(c, &serverInput) },
			},
			{
				Name:   "agent",
				Usage:  "join this machine to a cluster as a node",
				Flags:  config.AgentFlags(&agentInput),
				Action: func(c *cli.Context) error { return runAgent(c, &agentInput) },
			},
			{
				Name:        "witness",
				Usage:       "run only a voting member of a cluster's embedded etcd: the third vote that lets two servers lose either one (no apiserver, kubelet or containerd)",
				Flags:       config.WitnessFlags(&witnessInput),
				Action:      func(c *cli.Context) error { return runWitness(c, &witnessInput) },
				Subcommands: []*cli.Command{witness.StatusCommand()},
			},
			{
				Name:  "datastore",
				Usage: "manage a server's datastore",
				Subcommands: []*cli.Command{{
					Name:  "migrate",
					Usage: "move a stopped server's cluster, with everything in it, to another datastore; the old one is kept beside it",
					Flags: append(config.ServerFlags(&migrateInput), config.MigrateFlags(&migrateTarget)...),
					Action: func(c *cli.Context) error {
						cfg, err := migrateInput.Parse(config.DetectHost())
						if err != nil {
							return err
						}
						to, err := migrateTarget.Target()
						if err != nil {
							return err
						}
						logging.Setup(cfg.Debug)
						return server.MigrateDatastore(c.Context, cfg, to, c.App.Writer)
					},
				}},
			},
			tokencmd.Command(),
			snapshot.Command(),
			bootguard.Command(),
			cluster.Command(),
			certificate.Command(),
			secretsencrypt.Command(),
			{
				Name:  "check-config",
				Usage: "check that this host's kernel and system can run a kelp node, and say how to fix what is missing",
				Action: func(c *cli.Context) error {
					results := hostcheck.Host{Root: "/"}.Check()
					hostcheck.Print(c.App.Writer, results)
					if hostcheck.Failures(results) != nil {
						return cli.Exit("", 1)
					}
					return nil
				},
			},
			killall.Command(),
			{
				Name:            "crictl",
				Usage:           "inspect pods, containers and images through the CRI of kelp's containerd; a leading --data-dir DIR picks the node",
				SkipFlagParsing: true,
				Action:          func(c *cli.Context) error { return crictl.Main(append([]string{"crictl"}, c.Args().Slice()...)) },
			},
			{
				Name:            "ctr",
				Usage:           "run containerd's ctr against kelp's containerd; a leading --data-dir DIR picks the node",
				SkipFlagParsing: true,
				Action:          func(c *cli.Context) error { return containerd.CtrMain(append([]string{"ctr"}, c.Args().Slice()...)) },
			},
			{
				Name:            "etcdctl",
				Usage:           "run etcdctl against this server's datastore (embedded etcd, or SQLite through kine); a leading --data-dir DIR picks another server",
				SkipFlagParsing: true,
				Action:          func(c *cli.Context) error { return etcdctl.Main(append([]string{"etcdctl"}, c.Args().Slice()...)) },
			},
			{
				Name:            "kubectl",
				Usage:           "run kubectl (uses /etc/kelp/kelp.yaml unless KUBECONFIG is set)",
				SkipFlagParsing: true,
				Action: func(c *cli.Context) error {
					kubectl.Run(c.Args().Slice())
					return nil
				},
			},
		},
	}
}

func runAgent(c *cli.Context, in *config.AgentInput) error {
	if c.Args().Present() {
		return fmt.Errorf("kelp agent takes no arguments, got %q", c.Args().Slice())
	}
	cfg, err := in.Parse(config.DetectHost())
	if err != nil {
		return err
	}
	logging.Setup(cfg.Node.Debug)
	if os.Geteuid() != 0 {
		return errors.New("kelp agent must run as root (it manages mounts, containers and the network of this machine): run it with sudo")
	}
	if err := agent.CheckHost(); err != nil {
		return err
	}
	collectGarbageSooner()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills at once
	}()
	return agent.Join(ctx, cfg)
}

func runWitness(c *cli.Context, in *config.WitnessInput) error {
	if c.Args().Present() {
		return fmt.Errorf("kelp witness takes no arguments, got %q", c.Args().Slice())
	}
	cfg, err := in.Parse(config.DetectHost())
	if err != nil {
		return err
	}
	logging.Setup(cfg.Debug)
	collectGarbageSooner()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills at once
	}()
	return witness.Run(ctx, cfg)
}

func runServer(c *cli.Context, in *config.ServerInput) error {
	if c.Args().Present() {
		return fmt.Errorf("kelp server takes no arguments, got %q", c.Args().Slice())
	}
	cfg, err := in.Parse(config.DetectHost())
	if err != nil {
		return err
	}
	logging.Setup(cfg.Debug)
	collectGarbageSooner()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills at once
	}()
	if cfg.ClusterReset {
		return server.ClusterReset(ctx, cfg)
	}
	return server.Run(ctx, cfg)
}

// collectGarbageSooner has Go collect garbage at 25 % heap growth instead
// of 100 %, unless GOGC says otherwise: kelp holds the caches of every
// in-process component, and this keeps an idle server about 75 MiB smaller
// (some 40 of them from 50 % to 25 %), for a collector that takes about
// twice its share of kelp's CPU (7 % of it at 50 %), within the noise of an
// idle node (scripts/bench-node.sh, scripts/bench-nodes.sh for an agent).
func collectGarbageSooner() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(25)
	}
}
