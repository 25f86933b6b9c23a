package crictl

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A container or pod the kubelet still wants comes back: these commands
// are for what it no longer tracks, or to force a restart.

func stopContainers(ctx context.Context, c *cli.Context, cl clients) error {
	return eachID(ctx, c, cl, "CONTAINER-ID", func(ctx context.Context, id string) error {
		full, err := containerID(ctx, cl, id)
		if err != nil {
			return err
		}
		if _, err := cl.runtime.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: full, Timeout: 10}); err != nil {
			return fmt.Errorf("stop container %s: %w", id, err)
		}
		return nil
	})
}

func removeContainers(ctx context.Context, c *cli.Context, cl clients) error {
	return eachID(ctx, c, cl, "CONTAINER-ID", func(ctx context.Context, id string) error {
		full, err := containerID(ctx, cl, id)
		if err != nil {
			return err
		}
		if _, err := cl.runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: full}); err != nil {
			return fmt.Errorf("remove container %s: %w", id, err)
		}
		return nil
	})
}

func stopPods(ctx context.Context, c *cli.Context, cl clients) error {
	return eachID(ctx, c, cl, "POD-ID", func(ctx context.Context, id string) error {
		full, err := podID(ctx, cl, id)
		if err != nil {
			return err
		}
		if _, err := cl.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: full}); err != nil {
			return fmt.Errorf("stop pod %s: %w", id, err)
		}
		return nil
	})
}

func removePods(ctx context.Context, c *cli.Context, cl clients) error {
	return eachID(ctx, c, cl, "POD-ID", func(ctx context.Context, id string) error {
		full, err := podID(ctx, cl, id)
		if err != nil {
			return err
		}
		if _, err := cl.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: full}); err != nil {
			return fmt.Errorf("remove pod %s: %w", id, err)
		}
		return nil
	})
}

func removeImages(ctx context.Context, c *cli.Context, cl clients) error {
	return eachID(ctx, c, cl, "IMAGE", func(ctx context.Context, ref string) error {
		resp, err := cl.images.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
		if err != nil {
			return fmt.Errorf("image %s: %w", ref, err)
		}
		if resp.Image == nil {
			return fmt.Errorf("image %s not found on this node (kelp crictl images lists them)", ref)
		}
		if _, err := cl.images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}}); err != nil {
			return fmt.Errorf("remove image %s: %w", ref, err)
		}
		return nil
	})
}

// The runtime removes what it does not know without a word (the CRI
// makes removal idempotent), which would pass a mistyped ID as done: the
// commands look up what an ID names first, also to resolve a short one.

func containerID(ctx context.Context, cl clients, id string) (string, error) {
	resp, err := cl.runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return "", lookupError(err, "container", id, "ps -a")
	}
	return resp.Status.GetId(), nil
}

func podID(ctx context.Context, cl clients, id string) (string, error) {
	resp, err := cl.runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		return "", lookupError(err, "pod", id, "pods")
	}
	return resp.Status.GetId(), nil
}

// lookupError says of an ID the runtime does not know where to find the
// right one, with list, the crictl command that lists them.
func lookupError(err error, what, id, list string) error {
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%s %s not found on this node (kelp crictl %s lists them)", what, id, list)
	}
	return fmt.Errorf("%s %s: %w", what, id, err)
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
			return err
		}
		fmt.Fprintln(c.App.Writer, id)
		return nil
	})
}
