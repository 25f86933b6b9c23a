package crictl

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/containerd"
)

// Main runs crictl with args (args[0] is the program name) against the
// containerd of the kelp node that a leading --data-dir DIR names (else
// KELP_DATA_DIR, else kelp's config file, else /var/lib/kelp; see
// config.LeadingDataDir), unless --runtime-endpoint or
// CONTAINER_RUNTIME_ENDPOINT names another.
func Main(args []string) error {
	dataDir, rest, err := config.ToolDataDir(args[1:])
	if err != nil {
		return err
	}
	return app(func() (containerd.Node, error) { return containerd.Find(dataDir) }).Run(append([]string{args[0]}, rest...))
}

// app is crictl; find finds the node's containerd when no endpoint is
// given.
func app(find func() (containerd.Node, error)) *cli.App {
	with := func(fn func(context.Context, *cli.Context, clients) error) cli.ActionFunc {
		return withClient(find, fn)
	}
	return &cli.App{
		Name:            "crictl",
		Usage:           "inspect the pods, containers and images of kelp's container runtime",
		HideHelpCommand: true,
		// -it, as crictl users type it.
		UseShortOptionHandling: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "runtime-endpoint", Aliases: []string{"r"}, EnvVars: []string{"CONTAINER_RUNTIME_ENDPOINT"}, Usage: "CRI endpoint (default: the containerd of the node of --data-dir, given before the other arguments)"},
			&cli.DurationFlag{Name: "timeout", Aliases: []string{"t"}, Value: 10 * time.Second, Usage: "timeout of each call"},
		},
		Commands: []*cli.Command{
			{Name: "version", Usage: "show the runtime's name and version", Action: with(version)},
			{Name: "info", Usage: "show the runtime's status and configuration", Action: with(info)},
			{Name: "pods", Usage: "list pod sandboxes", Flags: []cli.Flag{quietFlag, nameFlag, namespaceFlag}, Action: with(pods)},
			{Name: "ps", Usage: "list containers", Flags: []cli.Flag{quietFlag, nameFlag, &cli.StringFlag{Name: "pod", Aliases: []string{"p"}, Usage: "only the containers of this pod ID"},
				&cli.BoolFlag{Name: "all", Aliases: []string{"a"}, Usage: "show exited containers too"}}, Action: with(ps)},
			{Name: "images", Aliases: []string{"image", "img"}, Usage: "list images", Flags: []cli.Flag{quietFlag}, Action: with(images)},
			{Name: "inspect", Usage: "show containers' status as JSON", ArgsUsage: "CONTAINER-ID...", Action: with(inspect)},
			{Name: "inspectp", Usage: "show pod sandboxes' status as JSON", ArgsUsage: "POD-ID...", Action: with(inspectPods)},
			{Name: "inspecti", Usage: "show images' status as JSON", ArgsUsage: "IMAGE...", Action: with(inspectImages)},
			{Name: "stats", Usage: "show the resource usage of running containers", Flags: []cli.Flag{&cli.StringFlag{Name: "pod", Aliases: []string{"p"}, Usage: "only the containers of this pod ID"}}, Action: with(stats)},
			{Name: "logs", Usage: "print a container's log", ArgsUsage: "CONTAINER-ID", Flags: []cli.Flag{
				&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing what the container writes"},
				&cli.IntFlag{Name: "tail", Value: -1, Usage: "print only the last N lines"},
				&cli.BoolFlag{Name: "timestamps", Aliases: []string{"t"}, Usage: "print each line's time"},
			}, Action: with(logs)},
			{Name: "exec", Usage: "run a command in a running container", ArgsUsage: "CONTAINER-ID COMMAND [ARG...]", Flags: []cli.Flag{
				&cli.BoolFlag{Name: "interactive", Aliases: []string{"i"}, Usage: "pass stdin to the command"},
				&cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "give the command a terminal"},
				&cli.BoolFlag{Name: "sync", Aliases: []string{"s"}, Usage: "run it through the runtime and print its output when it ends"},
			}, Action: with(execCommand)},
			{Name: "stop", Usage: "stop running containers", ArgsUsage: "CONTAINER-ID...", Action: with(stopContainers)},
			{Name: "rm", Usage: "remove containers", ArgsUsage: "CONTAINER-ID...", Action: with(removeContainers)},
			{Name: "stopp", Usage: "stop pod sandboxes and their containers", ArgsUsage: "POD-ID...", Action: with(stopPods)},
			{Name: "rmp", Usage: "remove stopped pod sandboxes", ArgsUsage: "POD-ID...", Action: with(removePods)},
			{Name: "rmi", Usage: "remove images", ArgsUsage: "IMAGE...", Action: with(removeImages)},
			{Name: "pull", Usage: "pull an image through the node's registry configuration", ArgsUsage: "IMAGE", Action: with(pull)},
		},
	}
}

var (
	quietFlag     = &cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print IDs only"}
	nameFlag      = &cli.StringFlag{Name: "name", Usage: "only those whose name matches this regular expression, as crictl's (e.g. ^web$)"}
	namespaceFlag = &cli.StringFlag{Name: "namespace", Usage: "only the pods of this namespace"}
)

// nameMatcher is --name as crictl reads it: a regular expression that
// matches anywhere in the name unless anchored; none matches every name.
func nameMatcher(c *cli.Context) (*regexp.Regexp, error) {
	re, err := regexp.Compile(c.String("name"))
	if err != nil {
		return nil, fmt.Errorf("--name %q is not a regular expression: %w", c.String("name"), err)
	}
	return re, nil
}

type clients struct {
	runtime runtimeapi.RuntimeServiceClient
	images  runtimeapi.ImageServiceClient
	// timeout bounds each call; a stream (logs -f, exec) runs unbounded.
	timeout time.Duration
	// node is where the runtime's paths (log files) are seen from here.
	node containerd.Node
}

// call bounds one call by the --timeout.
func (cl clients) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, cl.timeout)
}

func withClient(find func() (containerd.Node, error), fn func(context.Context, *cli.Context, clients) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		var node containerd.Node
		endpoint := c.String("runtime-endpoint")
		if endpoint == "" {
			var err error
			if node, err = find(); err != nil {
				return err
			}
			endpoint = "unix://" + node.Address()
		}
		target := endpoint
		if strings.HasPrefix(endpoint, "unix://") {
			target = "unix:" + strings.TrimPrefix(endpoint, "unix://")
		}
		conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("connect to %s: %w", endpoint, err)
		}
		defer conn.Close()
		err = fn(c.Context, c, clients{runtimeapi.NewRuntimeServiceClient(conn), runtimeapi.NewImageServiceClient(conn), c.Duration("timeout"), node})
		if _, exited := err.(cli.ExitCoder); exited {
			// A command run by exec ended with this status: crictl's own.
			return err
		}
		if status.Code(err) == codes.Unavailable {
			return fmt.Errorf("%w (is kelp running? the runtime endpoint is %s)", err, endpoint)
		}
		return err
	}
}

func version(ctx context.Context, c *cli.Context, cl clients) error {
	ctx, cancel := cl.call(ctx)
	defer cancel()
	v, err := cl.runtime.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "Version:  %s\nRuntimeName:  %s\nRuntimeVersion:  %s\nRuntimeApiVersion:  %s\n", v.Version, v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	return nil
}

func pods(ctx context.Context, c *cli.Context, cl clients) error {
	name, err := nameMatcher(c)
	if err != nil {
		return err
	}
	ctx, cancel := cl.call(ctx)
	defer cancel()
	resp, err := cl.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	items := slices.DeleteFunc(resp.Items, func(p *runtimeapi.PodSandbox) bool {
		ns := c.String("namespace")
		return !name.MatchString(p.Metadata.GetName()) || (ns != "" && p.Metadata.GetNamespace() != ns)
	})
	sort.Slice(items, func(i, j int) bool { return items[i].CreatedAt > items[j].CreatedAt })
	return table(c.App.Writer, c.Bool("quiet"), 0, []string{"POD ID", "CREATED", "STATE", "NAME", "NAMESPACE", "ATTEMPT"}, len(items), func(i int) []string {
		p := items[i]
		return []string{short(p.Id), age(p.CreatedAt), strings.TrimPrefix(p.State.String(), "SANDBOX_"), p.Metadata.GetName(), p.Metadata.GetNamespace(), fmt.Sprint(p.Metadata.GetAttempt())}
	})
}

func ps(ctx context.Context, c *cli.Context, cl clients) error {
	name, err := nameMatcher(c)
	if err != nil {
		return err
	}
	ctx, cancel := cl.call(ctx)
	defer cancel()
	req := &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: c.String("pod")}}
	if !c.Bool("all") {
		req.Filter.State = &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}
	}
	resp, err := cl.runtime.ListContainers(ctx, req)
	if err != nil {
		return err
	}
	items := slices.DeleteFunc(resp.Containers, func(ct *runtimeapi.Container) bool {
		return !name.MatchString(ct.Metadata.GetName())
	})
	sort.Slice(items, func(i, j int) bool { return items[i].CreatedAt > items[j].CreatedAt })
	return table(c.App.Writer, c.Bool("quiet"), 0, []string{"CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID", "POD"}, len(items), func(i int) []string {
		ct := items[i]
		return []string{short(ct.Id), ct.ImageRef, age(ct.CreatedAt), strings.TrimPrefix(ct.State.String(), "CONTAINER_"), ct.Metadata.GetName(), fmt.Sprint(ct.Metadata.GetAttempt()), short(ct.PodSandboxId), ct.Labels["io.kubernetes.pod.name"]}
	})
}

func images(ctx context.Context, c *cli.Context, cl clients) error {
	ctx, cancel := cl.call(ctx)
	defer cancel()
	resp, err := cl.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return err
	}
	type row struct{ repo, tag, id, size, pinned string }
	var rows []row
	for _, img := range resp.Images {
		pinned := ""
		if img.Pinned {
			pinned = "true"
		}
		tags := img.RepoTags
		if len(tags) == 0 {
			tags = []string{"<none>:<none>"}
		}
		for _, t := range tags {
			i := strings.LastIndex(t, ":")
			rows = append(rows, row{t[:i], t[i+1:], short(strings.TrimPrefix(img.Id, "sha256:")), humanSize(img.Size), pinned})
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].repo+rows[i].tag < rows[j].repo+rows[j].tag })
	return table(c.App.Writer, c.Bool("quiet"), 2, []string{"IMAGE", "TAG", "IMAGE ID", "SIZE", "PINNED"}, len(rows), func(i int) []string {
		r := rows[i]
		return []string{r.repo, r.tag, r.id, r.size, r.pinned}
	})
}

// table prints rows under header, or with quiet only the column idColumn.
func table(w io.Writer, quiet bool, idColumn int, header []string, n int, row func(int) []string) error {
	if quiet {
		for i := range n {
			fmt.Fprintln(w, row(i)[idColumn])
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for i := range n {
		fmt.Fprintln(tw, strings.Join(row(i), "\t"))
	}
	return tw.Flush()
}

func short(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}

func age(nanos int64) string {
	d := time.Since(time.Unix(0, nanos)).Round(time.Second)
	return d.String() + " ago"
}

func humanSize(b uint64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1fMB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1fkB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%dB", b)
}
