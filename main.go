// Command kelp is a Kubernetes distribution in one binary.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/kubectl"
	"github.com/kelp-dev/kelp/internal/logging"
	"github.com/kelp-dev/kelp/internal/version"
	"github.com/kelp-dev/kelp/server"
)

func main() {
	// Multicall: a link named kubectl runs kubectl.
	if filepath.Base(os.Args[0]) == "kubectl" {
		kubectl.Run(os.Args[1:])
		return
	}
	app := newApp()
	args, err := config.WithFileArgs(app, os.Args)
	if err == nil {
		err = app.Run(args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kelp:", err)
		os.Exit(1)
	}
}

func newApp() *cli.App {
	cli.VersionFlag = &cli.BoolFlag{Name: "version", Usage: "print the versions of kelp and its components"}
	cli.VersionPrinter = func(*cli.Context) { fmt.Print(version.String()) }
	var serverInput config.ServerInput
	return &cli.App{
		Name:            "kelp",
		Usage:           "Kubernetes in one binary",
		Version:         version.Version,
		HideHelpCommand: true,
		Commands: []*cli.Command{
			{
				Name:   "server",
				Usage:  "run a control plane (and, in a later version, a node)",
				Flags:  config.ServerFlags(&serverInput),
				Action: func(c *cli.Context) error { return runServer(c, &serverInput) },
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

func runServer(c *cli.Context, in *config.ServerInput) error {
	if c.Args().Present() {
		return fmt.Errorf("kelp server takes no arguments, got %q", c.Args().Slice())
	}
	cfg, err := in.Parse(config.DetectHost())
	if err != nil {
		return err
	}
	logging.Setup(cfg.Debug)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills at once
	}()
	return server.Run(ctx, cfg)
}
