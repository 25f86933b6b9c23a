package cluster

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/kubectl"
)

// Command is `kelp cluster`: clusters of several nodes on this machine.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "cluster",
		Usage: "make throwaway clusters of several nodes on this machine, each node in namespaces of its own (for CI and tests; no Docker needed)",
		Subcommands: []*cli.Command{
			createCommand(),
			{
				Name:      "list",
				Usage:     "list the clusters on this machine",
				Flags:     []cli.Flag{rootFlag()},
				Action:    func(c *cli.Context) error { return printList(c.App.Writer, c.String("root")) },
				ArgsUsage: " ",
			},
			{
				Name:      "delete",
				Usage:     "delete clusters: every process, namespace, cgroup, interface and file they made",
				ArgsUsage: "NAME…",
				Flags:     []cli.Flag{rootFlag(), &cli.BoolFlag{Name: "all", Usage: "delete every cluster"}},
				Action: func(c *cli.Context) error {
					if err := CheckHost("/proc"); err != nil {
						return err
					}
					names := c.Args().Slice()
					if c.Bool("all") {
						states, err := list(c.String("root"))
						if err != nil {
							return err
						}
						for _, s := range states {
							names = append(names, s.Name)
						}
					} else if len(names) == 0 {
						return errors.New("name the clusters to delete, or give --all")
					}
					var errs []error
					for _, name := range names {
						errs = append(errs, Delete(c.String("root"), name, c.App.Writer))
					}
					return errors.Join(errs...)
				},
			},
			{
				Name:      "stop",
				Usage:     "stop a cluster's nodes; its data stays for start",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{rootFlag()},
				Action: func(c *cli.Context) error {
					name, err := oneName(c)
					if err == nil {
						err = CheckHost("/proc")
					}
					if err != nil {
						return err
					}
					return Stop(c.String("root"), name)
				},
			},
			{
				Name:      "start",
				Usage:     "start a stopped cluster with the data it had",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{rootFlag(), waitFlag()},
				Action: func(c *cli.Context) error {
					name, err := oneName(c)
					if err == nil {
						err = CheckHost("/proc")
					}
					if err != nil {
						return err
					}
					if _, err := Start(c.String("root"), name); err != nil {
						return err
					}
					_, err = Wait(c.Context, c.String("root"), name, c.Duration("wait"), "")
					return err
				},
			},
			{
				Name:      "kubeconfig",
				Usage:     "print a cluster's kubeconfig (context kelp-NAME)",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{rootFlag(), &cli.BoolFlag{Name: "path", Usage: "print the file's path instead"}},
				Action: func(c *cli.Context) error {
					name, err := oneName(c)
					if err != nil {
						return err
					}
					path, err := Kubeconfig(c.String("root"), name)
					if err != nil {
						return err
					}
					if c.Bool("path") {
						fmt.Fprintln(c.App.Writer, path)
						return nil
					}
					data, err := os.ReadFile(path)
					if err == nil {
						_, err = c.App.Writer.Write(data)
					}
					return err
				},
			},
			{
				Name:            "kubectl",
				Usage:           "run kubectl against a cluster: kelp cluster kubectl NAME get nodes",
				ArgsUsage:       "NAME ARGS…",
				SkipFlagParsing: true,
				Action: func(c *cli.Context) error {
					args := c.Args().Slice()
					root := rootFromEnv()
					if len(args) == 0 {
						return errors.New("name the cluster: kelp cluster kubectl NAME get nodes")
					}
					path, err := Kubeconfig(root, args[0])
					if err != nil {
						return err
					}
					kubectl.Run(append([]string{"--kubeconfig", path}, args[1:]...))
					return nil
				},
			},
			{
				Name:      "exec",
				Usage:     "run a command inside a node of a cluster: kelp cluster exec NAME server-1 -- kelp crictl ps",
				ArgsUsage: "NAME NODE -- COMMAND…",
				Flags:     []cli.Flag{rootFlag()},
				Action: func(c *cli.Context) error {
					args := c.Args().Slice()
					if len(args) > 2 && args[2] == "--" {
						args = append(args[:2], args[3:]...)
					}
					if len(args) < 3 {
						return errors.New("give the cluster, the node and the command: kelp cluster exec NAME server-1 -- kelp crictl ps")
					}
					cmd, err := Exec(c.String("root"), args[0], args[1], args[2:])
					if err != nil {
						return err
					}
					cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, c.App.Writer, c.App.ErrWriter
					if err := cmd.Run(); err != nil {
						var exit *exec.ExitError
						if errors.As(err, &exit) {
							return cli.Exit("", exit.ExitCode())
						}
						return err
					}
					return nil
				},
			},
			{
				Name:  "image",
				Usage: "images of a cluster's nodes",
				Subcommands: []*cli.Command{{
					Name:      "import",
					Usage:     "import image tarballs (docker save, OCI layout; .tar, .tar.gz, .tar.zst) into every node of a cluster",
					ArgsUsage: "NAME FILE_OR_DIR…",
					Flags:     []cli.Flag{rootFlag()},
					Action: func(c *cli.Context) error {
						args := c.Args().Slice()
						if len(args) < 2 {
							return errors.New("give the cluster and the image tarballs: kelp cluster image import NAME app.tar")
						}
						return ImportImages(c.Context, c.String("root"), args[0], args[1:], c.App.Writer)
					},
				}},
			},
			{
				Name:            "forward",
				Hidden:          true,
				Usage:           "publish a cluster's ports on the host (started by create and start)",
				SkipFlagParsing: true,
				Action: func(c *cli.Context) error {
					ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
					defer stop()
					return Forward(ctx, c.Args().Slice(), os.Stdout)
				},
			},
		},
	}
}

func rootFlag() cli.Flag {
	return &cli.StringFlag{Name: "root", EnvVars: []string{"KELP_CLUSTER_ROOT"}, Value: DefaultRoot, Usage: "where clusters keep their state"}
}

// rootFromEnv is --root for a command that passes its flags on (kubectl).
func rootFromEnv() string {
	if r := os.Getenv("KELP_CLUSTER_ROOT"); r != "" {
		return r
	}
	return DefaultRoot
}

func waitFlag() cli.Flag {
	return &cli.DurationFlag{Name: "wait", Value: 3 * time.Minute, Usage: "wait this long for every node to be Ready (0: return once the nodes run)"}
}

func oneName(c *cli.Context) (string, error) {
	if c.NArg() != 1 {
		return "", fmt.Errorf("name one cluster: kelp cluster %s NAME", c.Command.Name)
	}
	return c.Args().First(), nil
}

func createCommand() *cli.Command {
	flags := []cli.Flag{
		rootFlag(),
		&cli.IntFlag{Name: "servers", Value: 1, Usage: "servers (control plane and node); several run embedded etcd"},
		&cli.IntFlag{Name: "agents", Usage: "agents (nodes only)"},
		&cli.StringFlag{Name: "datastore", Usage: "sqlite (one server) or etcd (default: sqlite for one server, etcd for more)"},
		&cli.StringSliceFlag{Name: "image", Usage: "image tarball, or directory of them, every node imports at start (repeatable)"},
		&cli.StringSliceFlag{Name: "port", Usage: "HOST:NODEPORT: publish a NodePort of the cluster on the host's loopback port HOST (repeatable)"},
		waitFlag(),
		&cli.BoolFlag{Name: "kubeconfig-update-default", Usage: "merge the cluster's context, kelp-NAME, into the default kubeconfig ($KUBECONFIG or ~/.kube/config) and make it current"},
	}
	return &cli.Command{
		Name:      "create",
		Usage:     "make a cluster of servers and agents on this machine and start it",
		ArgsUsage: "[NAME] [-- FLAGS FOR EVERY KELP SERVER AND AGENT…]",
		Flags:     flags,
		Action: func(c *cli.Context) error {
			f, err := parseCreate(c, flags)
			if err != nil {
				return err
			}
			o := Options{Name: f.name, Args: f.extra, Servers: f.int("servers"), Agents: f.int("agents"), Datastore: f.string("datastore"), Images: f.slice("image")}
			for _, p := range f.slice("port") {
				port, err := ParsePort(p)
				if err != nil {
					return err
				}
				o.Ports = append(o.Ports, port)
			}
			if err := CheckHost("/proc"); err != nil {
				return err
			}
			if o.Binary, err = os.Executable(); err != nil {
				return err
			}
			root := f.string("root")
			started := time.Now()
			if _, err := Create(root, o); err != nil {
				return errors.Join(fmt.Errorf("create cluster %s: %w", o.Name, err), cleanupFailed(root, o.Name))
			}
			into := ""
			if f.bool("kubeconfig-update-default") {
				into = DefaultKubeconfig()
			}
			path, err := Wait(c.Context, root, o.Name, f.duration("wait"), into)
			if err != nil {
				return fmt.Errorf("%w (the cluster is kept for a look: kelp cluster delete %s)", err, o.Name)
			}
			fmt.Fprintf(c.App.Writer, "cluster %s: %d servers, %d agents, up in %s\nkubectl --kubeconfig %s get nodes\n",
				o.Name, o.Servers, o.Agents, time.Since(started).Round(100*time.Millisecond), path)
			if into != "" {
				fmt.Fprintf(c.App.Writer, "context %s is current in %s\n", Context(o.Name), into)
			}
			return nil
		},
	}
}

// createFlags are create's flags, wherever they were given: urfave/cli
// stops parsing at the first argument that is no flag, so the flags after
// the cluster's name are parsed again, and win.
type createFlags struct {
	name  string
	extra []string // after "--": for every kelp server and agent
	c     *cli.Context
	after *flag.FlagSet
	set   map[string]bool // given after the name
}

// parseCreate reads the name (default "kelp"), the flags after it, and
// the flags after "--" from what urfave/cli left of create's arguments.
func parseCreate(c *cli.Context, flags []cli.Flag) (*createFlags, error) {
	f := &createFlags{name: "kelp", c: c, set: map[string]bool{}}
	args := c.Args().Slice()
	if len(args) > 0 && args[0] != "--" && !strings.HasPrefix(args[0], "-") {
		f.name, args = args[0], args[1:]
		f.after = flag.NewFlagSet("create", flag.ContinueOnError)
		f.after.SetOutput(io.Discard)
		for _, fl := range flags {
			if err := fl.Apply(f.after); err != nil {
				return nil, err
			}
		}
		if err := f.after.Parse(args); err != nil {
			return nil, fmt.Errorf("kelp cluster create %s: %w", f.name, err)
		}
		f.after.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
		rest := f.after.Args()
		if stop := len(args) - len(rest); stop > 0 && args[stop-1] == "--" {
			f.extra = rest
			return f, nil
		}
		args = rest
	} else if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return nil, fmt.Errorf("kelp cluster create: unexpected %q: give one name, then flags, then -- and the flags for kelp server and agent", args[0])
	}
	f.extra = args
	return f, nil
}

func (f *createFlags) int(name string) int {
	if f.set[name] {
		return f.after.Lookup(name).Value.(flag.Getter).Get().(int)
	}
	return f.c.Int(name)
}

func (f *createFlags) string(name string) string {
	if f.set[name] {
		return f.after.Lookup(name).Value.String()
	}
	return f.c.String(name)
}

func (f *createFlags) bool(name string) bool {
	if f.set[name] {
		return f.after.Lookup(name).Value.(flag.Getter).Get().(bool)
	}
	return f.c.Bool(name)
}

func (f *createFlags) duration(name string) time.Duration {
	if f.set[name] {
		return f.after.Lookup(name).Value.(flag.Getter).Get().(time.Duration)
	}
	return f.c.Duration(name)
}

func (f *createFlags) slice(name string) []string {
	if f.set[name] {
		return append(f.c.StringSlice(name), f.after.Lookup(name).Value.(*cli.StringSlice).Value()...)
	}
	return f.c.StringSlice(name)
}

// cleanupFailed deletes what a failed create made, unless the name was
// another cluster's.
func cleanupFailed(root, name string) error {
	if _, err := os.Stat(filepath.Join(root, name, stateFile)); err != nil {
		return nil
	}
	return Delete(root, name, io.Discard)
}

func printList(w io.Writer, root string) error {
	states, err := list(root)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSERVERS\tAGENTS\tSTATUS\tNETWORK\tKUBECONFIG")
	for _, s := range states {
		servers, agents := 0, 0
		for _, n := range s.Nodes {
			if n.Role == "server" {
				servers++
			} else {
				agents++
			}
		}
		status := "stopped"
		if s.Running {
			status = "running"
			if !running(s) {
				status = "failed (kelp cluster start restarts it)"
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", s.Name, servers, agents, status, s.Subnet, paths{filepath.Join(root, s.Name)}.kubeconfig())
	}
	return tw.Flush()
}
