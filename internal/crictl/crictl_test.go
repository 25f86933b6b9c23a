package crictl

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kelp-dev/kelp/internal/containerd"
)

// fakeRuntime knows some containers, pods and images, and removes as
// containerd does: what it does not know without an error (the CRI makes
// removal idempotent).
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	mu               sync.Mutex
	containers, pods map[string]bool
	removed, stopped []string
}

func (f *fakeRuntime) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id := range f.containers {
		if strings.HasPrefix(id, r.ContainerId) {
			return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: id}}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", r.ContainerId)
}

func (f *fakeRuntime) PodSandboxStatus(_ context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pods[r.PodSandboxId] {
		return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: r.PodSandboxId}}, nil
	}
	return nil, status.Errorf(codes.NotFound, "an error occurred when try to find sandbox %q: not found", r.PodSandboxId)
}

func (f *fakeRuntime) StopContainer(_ context.Context, r *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = append(f.stopped, r.ContainerId)
	return &runtimeapi.StopContainerResponse{}, nil
}

func (f *fakeRuntime) RemoveContainer(_ context.Context, r *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, r.ContainerId)
	delete(f.containers, r.ContainerId)
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (f *fakeRuntime) StopPodSandbox(_ context.Context, r *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = append(f.stopped, r.PodSandboxId)
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (f *fakeRuntime) RemovePodSandbox(_ context.Context, r *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, r.PodSandboxId)
	delete(f.pods, r.PodSandboxId)
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

type fakeImages struct {
	runtimeapi.UnimplementedImageServiceServer
	runtime *fakeRuntime // holds the lock and the record
	images  map[string]bool
}

func (f *fakeImages) ImageStatus(_ context.Context, r *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	f.runtime.mu.Lock()
	defer f.runtime.mu.Unlock()
	if f.images[r.Image.Image] {
		return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: "sha256:1234"}}, nil
	}
	return &runtimeapi.ImageStatusResponse{}, nil
}

func (f *fakeImages) RemoveImage(_ context.Context, r *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	f.runtime.mu.Lock()
	defer f.runtime.mu.Unlock()
	f.runtime.removed = append(f.runtime.removed, r.Image.Image)
	delete(f.images, r.Image.Image)
	return &runtimeapi.RemoveImageResponse{}, nil
}

// serveFake serves a fakeRuntime on a unix socket and returns its
// endpoint.
func serveFake(t *testing.T) (*fakeRuntime, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRuntime{
		containers: map[string]bool{"c0ffee0123456789": true},
		pods:       map[string]bool{"p0d": true},
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	runtimeapi.RegisterImageServiceServer(srv, &fakeImages{runtime: f, images: map[string]bool{"docker.io/library/app:1.0": true}})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return f, "unix://" + sock
}

func run(endpoint string, args ...string) (string, error) {
	var out bytes.Buffer
	a := app(func() (containerd.Node, error) {
		return containerd.Node{}, errors.New("no node: the tests give an endpoint")
	})
	a.Writer, a.ErrWriter = &out, &out
	err := a.Run(append([]string{"crictl", "--runtime-endpoint", endpoint, "--timeout", "5s"}, args...))
	return out.String(), err
}

// TestBadInput gives the commands that change what runs no ID, a wrong ID,
// and a runtime that is down: each says what is wrong and what to do, and
// removes nothing.
func TestBadInput(t *testing.T) {
	f, endpoint := serveFake(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stop"}, "give a CONTAINER-ID (see kelp crictl stop --help)"},
		{[]string{"rm"}, "give a CONTAINER-ID (see kelp crictl rm --help)"},
		{[]string{"stopp"}, "give a POD-ID (see kelp crictl stopp --help)"},
		{[]string{"rmp"}, "give a POD-ID (see kelp crictl rmp --help)"},
		{[]string{"rmi"}, "give an IMAGE (see kelp crictl rmi --help)"},
		{[]string{"pull"}, "give one IMAGE"},
		{[]string{"logs"}, "give one CONTAINER-ID"},
		{[]string{"exec", "c0ffee"}, "give a CONTAINER-ID and a COMMAND"},
		{[]string{"stop", "deadbeef"}, "container deadbeef not found on this node (kelp crictl ps -a lists them)"},
		{[]string{"rm", "deadbeef"}, "container deadbeef not found on this node (kelp crictl ps -a lists them)"},
		{[]string{"stopp", "deadbeef"}, "pod deadbeef not found on this node (kelp crictl pods lists them)"},
		{[]string{"rmp", "deadbeef"}, "pod deadbeef not found on this node (kelp crictl pods lists them)"},
		{[]string{"rmi", "docker.io/library/app:2.0"}, "image docker.io/library/app:2.0 not found on this node (kelp crictl images lists them)"},
		{[]string{"logs", "deadbeef"}, "container deadbeef not found on this node"},
		{[]string{"inspect", "deadbeef"}, "container deadbeef not found on this node"},
		{[]string{"inspectp", "deadbeef"}, "pod deadbeef not found on this node"},
		{[]string{"exec", "-t", "c0ffee", "sh"}, "-t gives the command a terminal to type into, so it needs -i too: kelp crictl exec -it c0ffee sh"},
	} {
		out, err := run(endpoint, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "is kelp running") {
			t.Errorf("crictl %s: %v, want an error with %q alone\n%s", strings.Join(tc.args, " "), err, tc.want, out)
		}
	}
	if len(f.removed) > 0 || len(f.stopped) > 0 {
		t.Errorf("bad input stopped %v and removed %v", f.stopped, f.removed)
	}
	// Of several, the known ones are done, and the unknown named.
	out, err := run(endpoint, "rm", "deadbeef", "c0ffee")
	if err == nil || !strings.Contains(err.Error(), "container deadbeef not found") || out != "c0ffee\n" || len(f.removed) != 1 || f.removed[0] != "c0ffee0123456789" {
		t.Errorf("crictl rm deadbeef c0ffee: %v, printed %q, removed %v; want c0ffee, by its full ID, removed alone", err, out, f.removed)
	}
	if _, err := run("unix://"+filepath.Join(t.TempDir(), "none.sock"), "rm", "c0ffee"); err == nil || !strings.Contains(err.Error(), "is kelp running? the runtime endpoint is unix://") {
		t.Errorf("crictl rm with the runtime down: %v, want the question whether kelp runs", err)
	}
}

// TestMainDataDir: kelp crictl takes a leading --data-dir, else
// KELP_DATA_DIR, and talks to that node's containerd; before, crictl
// refused the flag and always used /run/kelp.
func TestMainDataDir(t *testing.T) {
	dir := t.TempDir()
	err := Main([]string{"crictl", "--data-dir", dir, "ps"})
	if err == nil || !strings.Contains(err.Error(), "no containerd of a kelp node with data dir "+dir) {
		t.Errorf("kelp crictl --data-dir of no node: %v", err)
	}
	t.Setenv("KELP_DATA_DIR", dir)
	err = Main([]string{"crictl", "ps"})
	if err == nil || !strings.Contains(err.Error(), "no containerd of a kelp node with data dir "+dir) {
		t.Errorf("kelp crictl with KELP_DATA_DIR of no node: %v", err)
	}
	// An endpoint given is used as it is.
	f, endpoint := serveFake(t)
	err = Main([]string{"crictl", "--data-dir", dir, "--runtime-endpoint", endpoint, "stop", "c0ffee0123456789"})
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil || len(f.stopped) != 1 {
		t.Errorf("kelp crictl --runtime-endpoint: %v, stopped %q", err, f.stopped)
	}
}

// listing serves ListContainers and ListPodSandbox: one container and one
// pod named web, another of each named web-sidecar.
type listing struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (listing) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{
		{Id: "aaaa0000000000000000", Metadata: &runtimeapi.ContainerMetadata{Name: "web"}, State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		{Id: "bbbb0000000000000000", Metadata: &runtimeapi.ContainerMetadata{Name: "web-sidecar"}, State: runtimeapi.ContainerState_CONTAINER_RUNNING},
	}}, nil
}

func (listing) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{
		{Id: "cccc0000000000000000", Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default"}},
		{Id: "dddd0000000000000000", Metadata: &runtimeapi.PodSandboxMetadata{Name: "web-sidecar", Namespace: "default"}},
	}}, nil
}

// TestNameIsARegularExpression: --name of ps and pods is crictl's regular
// expression, so ^web$ picks web alone (it was a substring, and the VM
// lab's `crictl ps --name ^web$` found nothing); a bad one is refused.
func TestNameIsARegularExpression(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, listing{})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	endpoint := "unix://" + sock
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ps", "-q", "--name", "^web$"}, "aaaa"},
		{[]string{"ps", "-q", "--name", "web"}, "aaaa bbbb"},
		{[]string{"ps", "-q", "--name", "side"}, "bbbb"},
		{[]string{"ps", "-q"}, "aaaa bbbb"},
		{[]string{"pods", "-q", "--name", "^web$"}, "cccc"},
		{[]string{"pods", "-q", "--name", "car$"}, "dddd"},
	} {
		out, err := run(endpoint, tc.args...)
		var got []string
		for _, id := range strings.Fields(out) {
			got = append(got, id[:4])
		}
		if err != nil || strings.Join(got, " ") != tc.want {
			t.Errorf("crictl %s: %v, printed %q, want the IDs %s", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
	if _, err := run(endpoint, "ps", "--name", "web["); err == nil || !strings.Contains(err.Error(), `--name "web[" is not a regular expression`) {
		t.Errorf("crictl ps --name web[: %v, want it refused as no regular expression", err)
	}
}
