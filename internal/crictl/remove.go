package crictl

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v2"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A container or pod the kubelet still wants comes back: these commands
// are for what it no longer tracks, or to force a restart.

func stopContainers(ctx context.Context, c *cli.Context, cl clients) error {
	return eachID(ctx, c, cl, "CONTAINER-ID", func(ctx context.Context, id string) error {
		_, err := cl.runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 10})
		return err
	})
}

func removeContainers(ctx context.Context, c *cli.Context, cl clients) error {
	return eachID(ctx, c, cl, "CONTAINER-ID", func(ctx context.Context, id string) error {
		_, err := cl.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
		return err
	})
}

func stopPods(ctx context.Context, c *cli.Context, cl clients) error {
	return eachID(ctx, c, cl, "POD-ID", func(ctx context.Context, id string) error {
		_, err := cl.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
		return err
	})
}

func removePods(ctx context.Context, c *cli.Context, cl clients) error {
	return eachID(ctx, c, cl, "POD-ID", func(ctx context.Context, id string) error {
		_, err := cl.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
		return err
	})
}

func removeImages(ctx context.Context, c *cli.Context, cl clients) error {
	return eachID(ctx, c, cl, "IMAGE", func(ctx context.Context, ref string) error {
		_, err := cl.images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		return err
	})
}

// pull fetches an image as the kubelet would, through the node's mirrors
// and credentials (registries.yaml), not through per-call auth.
func pull(ctx context.Context, c *cli.Context, cl clients) error {
	if c.NArg() != 1 {
		return fmt.Errorf("give one IMAGE (see kelp crictl pull --help)")
	}
	resp, err := cl.images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: c.Args().First()}})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "Image is up to date for %s\n", resp.ImageRef)
	return nil
}

// eachID runs fn for every argument, printing each one done as crictl
// does, and goes on past failures.
func eachID(ctx context.Context, c *cli.Context, cl clients, what string, fn func(context.Context, string) error) error {
	return eachArg(c, what, func(id string) error {
		ctx, cancel := cl.call(ctx)
		defer cancel()
		if err := fn(ctx, id); err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		fmt.Fprintln(c.App.Writer, id)
		return nil
	})
}
