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
	"strconv"
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
			machineCommand(), networkCommand(), // hidden: package machine for scripts (plumbing.go)
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
					p, err := parse(c, -1)
					if err == nil {
						err = CheckHost("/proc")
					}
					if err != nil {
						return err
					}
					root, names := p.string("root"), p.args
					if p.bool("all") {
						states, err := list(root)
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
						errs = append(errs, Delete(root, name, c.App.Writer))
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
					p, name, err := parseOne(c)
					if err != nil {
						return err
					}
					return Stop(p.string("root"), name)
				},
			},
			{
				Name:      "start",
				Usage:     "start a stopped cluster with the data it had",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{rootFlag(), waitFlag()},
				Action: func(c *cli.Context) error {
					p, name, err := parseOne(c)
					if err != nil {
						return err
					}
					if _, err := Start(p.string("root"), name); err != nil {
						return err
					}
					_, err = Wait(c.Context, p.string("root"), name, p.duration("wait"), "")
					return err
				},
			},
			{
				Name:      "kubeconfig",
				Usage:     "print a cluster's kubeconfig (context kelp-NAME)",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{rootFlag(), &cli.BoolFlag{Name: "path", Usage: "print the file's path instead"}},
				Action: func(c *cli.Context) error {
					p, err := parse(c, 1)
					if err != nil {
						return err
					}
					name, err := p.oneName()
					if err != nil {
						return err
					}
					path, err := Kubeconfig(p.string("root"), name)
					if err != nil {
						return err
					}
					if p.bool("path") {
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
				Name:      "save",
				Usage:     "keep a copy of a cluster (its objects, images, volumes and nodes) to make new clusters from with create --from; a running cluster is stopped for the copy and started again",
				ArgsUsage: "NAME SNAPSHOT",
				Flags:     []cli.Flag{rootFlag(), waitFlag()},
				Action: func(c *cli.Context) error {
					p, err := parse(c, 2)
					if err == nil && (len(p.args) != 2 || len(p.extra) > 0) {
						err = errors.New("name the cluster and the snapshot: kelp cluster save NAME SNAPSHOT")
					}
					if err == nil {
						err = CheckHost("/proc")
					}
					if err != nil {
						return err
					}
					root, name := p.string("root"), p.args[0]
					started := time.Now()
					running := false
					if s, err := load(filepath.Join(root, name)); err == nil {
						running = s.Running
					}
					if err := Save(root, name, p.args[1]); err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "saved cluster %s as %s in %s\n", name, p.args[1], time.Since(started).Round(100*time.Millisecond))
					if running {
						_, err = Wait(c.Context, root, name, p.duration("wait"), "")
					}
					return err
				},
			},
			{
				Name:      "snapshots",
				Usage:     "list the saved clusters",
				ArgsUsage: " ",
				Flags:     []cli.Flag{rootFlag()},
				Action: func(c *cli.Context) error {
					snaps, err := Snapshots(c.String("root"))
					if err != nil {
						return err
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "SNAPSHOT\tFROM\tNODES\tSAVED")
					for _, s := range snaps {
						fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", s.Name, s.From, s.Nodes, s.Created.UTC().Format(time.RFC3339))
					}
					return tw.Flush()
				},
				Subcommands: []*cli.Command{{
					Name:      "delete",
					Usage:     "delete saved clusters",
					ArgsUsage: "SNAPSHOT…",
					Flags:     []cli.Flag{rootFlag()},
					Action: func(c *cli.Context) error {
						p, err := parse(c, -1)
						if err != nil {
							return err
						}
						var errs []error
						for _, name := range p.args {
							errs = append(errs, DeleteSnapshot(p.string("root"), name, c.App.Writer))
						}
						return errors.Join(errs...)
					},
				}},
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
					p, err := parse(c, 2)
					if err != nil {
						return err
					}
					if len(p.args) < 2 || len(p.extra) == 0 {
						return errors.New("give the cluster, the node and the command: kelp cluster exec NAME server-1 -- kelp crictl ps")
					}
					cmd, err := Exec(p.string("root"), p.args[0], p.args[1], p.extra)
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
						p, err := parse(c, -1)
						if err != nil {
							return err
						}
						if len(p.args) < 2 {
							return errors.New("give the cluster and the image tarballs: kelp cluster image import NAME app.tar")
						}
						return ImportImages(c.Context, p.string("root"), p.args[0], p.args[1:], c.App.Writer)
					},
				}},
			},
			{
				Name:            "forward",
				Hidden:          true,
				Usage:           "publish a cluster's ports on the host (started by create and start)",
				SkipFlagParsing: true,
				Action: func(c *cli.Context) error {
					args := c.Args().Slice()
					pid, err := strconv.Atoi(c.Args().First())
					if err != nil || len(args) < 2 {
						return errors.New("kelp cluster forward NETNS_PID LISTEN=TARGET…")
					}
					ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
					defer stop()
					return Forward(ctx, pid, args[1:], os.Stdout)
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

// parseOne parses the command line of a command that takes one cluster,
// and checks the host can run one.
func parseOne(c *cli.Context) (*parsed, string, error) {
	p, err := parse(c, 1)
	if err != nil {
		return nil, "", err
	}
	name, err := p.oneName()
	if err == nil {
		err = CheckHost("/proc")
	}
	return p, name, err
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
		&cli.StringFlag{Name: "from", Usage: "make the cluster from a snapshot `kelp cluster save` kept: its nodes, objects, images and volumes"},
		&cli.BoolFlag{Name: "kubeconfig-update-default", Usage: "merge the cluster's context, kelp-NAME, into the default kubeconfig ($KUBECONFIG or ~/.kube/config) and make it current"},
	}
	return &cli.Command{
		Name:      "create",
		Usage:     "make a cluster of servers and agents on this machine and start it",
		ArgsUsage: "[NAME] [-- FLAGS FOR EVERY KELP SERVER AND AGENT…]",
		Flags:     flags,
		Action: func(c *cli.Context) error {
			f, err := parse(c, 1)
			if err != nil {
				return err
			}
			name := "kelp"
			if len(f.args) > 0 {
				name = f.args[0]
			}
			if len(f.extra) > 0 && !strings.HasPrefix(f.extra[0], "-") {
				return fmt.Errorf("kelp cluster create: unexpected %q: give one name, then flags, then -- and the flags for kelp server and agent", f.extra[0])
			}
			o := Options{Name: name, Args: f.extra, Servers: f.int("servers"), Agents: f.int("agents"), Datastore: f.string("datastore"), Images: f.slice("image")}
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
			if err := Create(root, o, f.string("from")); err != nil {
				return fmt.Errorf("create cluster %s: %w", o.Name, err)
			}
			into := ""
			if f.bool("kubeconfig-update-default") {
				into = DefaultKubeconfig()
			}
			path, err := Wait(c.Context, root, o.Name, f.duration("wait"), into)
			if err != nil {
				return fmt.Errorf("%w (the cluster is kept for a look: kelp cluster delete %s)", err, o.Name)
			}
			fmt.Fprintf(c.App.Writer, "cluster %s is up in %s: %s\nkubectl --kubeconfig %s get nodes\n",
				o.Name, time.Since(started).Round(100*time.Millisecond), describe(root, o.Name), path)
			if into != "" {
				fmt.Fprintf(c.App.Writer, "context %s is current in %s\n", Context(o.Name), into)
			}
			return nil
		},
	}
}

// parsed is a command line of a cluster subcommand, flags wherever they
// were given: urfave/cli stops parsing at the first argument that is no
// flag, so what it left is parsed again, and flags found there win.
type parsed struct {
	args  []string // the positional arguments
	extra []string // after "--", or after the last positional argument a command takes
	c     *cli.Context
	after *flag.FlagSet
	set   map[string]bool // given after a positional argument
}

// parse reads what urfave/cli left of c's command line: positional
// arguments (at most maxArgs; -1: any number), the flags among them, and
// what follows "--" or the last positional argument.
func parse(c *cli.Context, maxArgs int) (*parsed, error) {
	p := &parsed{c: c, set: map[string]bool{}, after: flag.NewFlagSet(c.Command.Name, flag.ContinueOnError)}
	p.after.SetOutput(io.Discard)
	for _, fl := range c.Command.Flags {
		if err := fl.Apply(p.after); err != nil {
			return nil, err
		}
	}
	args := c.Args().Slice()
	// urfave/cli parses every flag before the first positional argument;
	// one left at the start came after a "--" it took.
	if len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "--" {
		p.extra = args
		return p, nil
	}
	for len(args) > 0 {
		switch {
		case args[0] == "--":
			p.extra = args[1:]
			args = nil
		case strings.HasPrefix(args[0], "-"):
			if err := p.after.Parse(args); err != nil {
				return nil, fmt.Errorf("kelp cluster %s: %w", c.Command.Name, err)
			}
			rest := p.after.Args()
			if used := args[:len(args)-len(rest)]; used[len(used)-1] == "--" {
				p.extra, rest = rest, nil
			}
			args = rest
		case len(p.args) == maxArgs:
			p.extra, args = args, nil
		default:
			p.args, args = append(p.args, args[0]), args[1:]
		}
	}
	p.after.Visit(func(fl *flag.Flag) { p.set[fl.Name] = true })
	return p, nil
}

func (p *parsed) int(name string) int {
	if p.set[name] {
		return p.after.Lookup(name).Value.(flag.Getter).Get().(int)
	}
	return p.c.Int(name)
}

func (p *parsed) string(name string) string {
	if p.set[name] {
		return p.after.Lookup(name).Value.String()
	}
	return p.c.String(name)
}

func (p *parsed) bool(name string) bool {
	if p.set[name] {
		return p.after.Lookup(name).Value.(flag.Getter).Get().(bool)
	}
	return p.c.Bool(name)
}

func (p *parsed) duration(name string) time.Duration {
	if p.set[name] {
		return p.after.Lookup(name).Value.(flag.Getter).Get().(time.Duration)
	}
	return p.c.Duration(name)
}

func (p *parsed) slice(name string) []string {
	if p.set[name] {
		return append(p.c.StringSlice(name), p.after.Lookup(name).Value.(*cli.StringSlice).Value()...)
	}
	return p.c.StringSlice(name)
}

// oneName is the one cluster a command names.
func (p *parsed) oneName() (string, error) {
	if len(p.args) != 1 || len(p.extra) > 0 {
		return "", fmt.Errorf("name one cluster: kelp cluster %s NAME", p.c.Command.Name)
	}
	return p.args[0], nil
}

// describe says what nodes cluster name has: "1 server, 2 agents".
func describe(root, name string) string {
	s, err := load(filepath.Join(root, name))
	if err != nil {
		return err.Error()
	}
	servers, agents := s.roles()
	return count(servers, "server") + ", " + count(agents, "agent")
}

// count says n things: "1 server", "2 agents".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return strconv.Itoa(n) + " " + thing + "s"
}

func printList(w io.Writer, root string) error {
	states, err := list(root)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSERVERS\tAGENTS\tSTATUS\tAPI\tKUBECONFIG")
	for _, s := range states {
		servers, agents := s.roles()
		status := "stopped"
		if s.Running {
			status = "running"
			if !running(s) {
				status = "failed (kelp cluster start restarts it)"
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\thttps://%s\t%s\n", s.Name, servers, agents, status, hostAddr(s.APIPort), paths{filepath.Join(root, s.Name)}.kubeconfig())
	}
	return tw.Flush()
}
