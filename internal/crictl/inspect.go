package crictl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// inspect prints, like crictl, {"status": …, "info": …} per container:
// the CRI status and the runtime's verbose details.
func inspect(ctx context.Context, c *cli.Context, cl clients) error {
	return eachArg(c, "CONTAINER-ID", func(id string) error {
		ctx, cancel := cl.call(ctx)
		defer cancel()
		resp, err := cl.runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
		if err != nil {
			return lookupError(err, "container", id, "ps -a")
		}
		return printStatus(c.App.Writer, resp.Status, resp.Info)
	})
}

func inspectPods(ctx context.Context, c *cli.Context, cl clients) error {
	return eachArg(c, "POD-ID", func(id string) error {
		ctx, cancel := cl.call(ctx)
		defer cancel()
		resp, err := cl.runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
		if err != nil {
			return lookupError(err, "pod", id, "pods")
		}
		return printStatus(c.App.Writer, resp.Status, resp.Info)
	})
}

func inspectImages(ctx context.Context, c *cli.Context, cl clients) error {
	return eachArg(c, "IMAGE", func(ref string) error {
		ctx, cancel := cl.call(ctx)
		defer cancel()
		resp, err := cl.images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}, Verbose: true})
		if err != nil {
			return fmt.Errorf("image %s: %w", ref, err)
		}
		if resp.Image == nil {
			return fmt.Errorf("image %s not found on this node (kelp crictl images lists them)", ref)
		}
		return printStatus(c.App.Writer, resp.Image, resp.Info)
	})
}

// info prints the runtime's conditions and, verbose, its configuration.
func info(ctx context.Context, c *cli.Context, cl clients) error {
	ctx, cancel := cl.call(ctx)
	defer cancel()
	resp, err := cl.runtime.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return err
	}
	return printStatus(c.App.Writer, resp.Status, resp.Info)
}

// printStatus prints status in the CRI's JSON form and the runtime's
// verbose info, whose values are JSON documents of their own, inline.
func printStatus(w io.Writer, status proto.Message, info map[string]string) error {
	raw, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(status)
	if err != nil {
		return err
	}
	out := map[string]json.RawMessage{"status": raw}
	for k, v := range info {
		if json.Valid([]byte(v)) {
			out[k] = json.RawMessage(v)
		} else {
			out[k], _ = json.Marshal(v)
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// stats prints the resource usage of the running containers as crictl
// does: CPU in percent of one core.
func stats(ctx context.Context, c *cli.Context, cl clients) error {
	ctx, cancel := cl.call(ctx)
	defer cancel()
	listed, err := cl.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		PodSandboxId: c.String("pod"),
		State:        &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}})
	if err != nil {
		return err
	}
	names := map[string]string{}
	for _, ct := range listed.Containers {
		names[ct.Id] = ct.Metadata.GetName()
	}
	resp, err := cl.runtime.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{Filter: &runtimeapi.ContainerStatsFilter{PodSandboxId: c.String("pod")}})
	if err != nil {
		return err
	}
	var items []*runtimeapi.ContainerStats
	for _, s := range resp.Stats {
		if _, running := names[s.Attributes.GetId()]; running {
			items = append(items, s)
		}
	}
	sort.Slice(items, func(i, j int) bool { return names[items[i].Attributes.GetId()] < names[items[j].Attributes.GetId()] })
	return table(c.App.Writer, false, 0, []string{"CONTAINER", "NAME", "CPU %", "MEM", "DISK", "INODES"}, len(items), func(i int) []string {
		s := items[i]
		return []string{
			short(s.Attributes.GetId()), names[s.Attributes.GetId()],
			fmt.Sprintf("%.2f", float64(s.Cpu.GetUsageNanoCores().GetValue())/1e7),
			humanSize(s.Memory.GetWorkingSetBytes().GetValue()),
			humanSize(s.WritableLayer.GetUsedBytes().GetValue()),
			fmt.Sprint(s.WritableLayer.GetInodesUsed().GetValue()),
		}
	})
}

// eachArg calls fn with every argument, and says what it wants when there
// is none.
func eachArg(c *cli.Context, what string, fn func(string) error) error {
	if c.NArg() == 0 {
		article := "a"
		if strings.ContainsAny(what[:1], "AEIOU") {
			article = "an"
		}
		return fmt.Errorf("give %s %s (see kelp crictl %s --help)", article, what, c.Command.Name)
	}
	var errs []error
	for _, arg := range c.Args().Slice() {
		errs = append(errs, fn(arg))
	}
	return errors.Join(errs...)
}
