package killall

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestMountsBelow(t *testing.T) {
	mountinfo := `22 1 8:1 / / rw - ext4 /dev/sda1 rw
30 22 8:2 / /var/lib/kelp rw - ext4 /dev/sda2 rw
31 30 0:40 / /var/lib/kelp/agent/containerd/tmpmounts/x rw - overlay overlay rw
32 22 0:41 / /run/kelp rw - tmpfs tmpfs rw
33 32 0:42 / /run/kelp/containerd/io.containerd.grpc.v1.cri/sandboxes/abc/shm rw - tmpfs shm rw
34 22 0:43 / /var/lib/kubelet/pods/p/volumes/kubernetes.io~projected/token rw - tmpfs tmpfs rw
35 22 0:44 / /var/lib/kelpish rw - tmpfs tmpfs rw
36 22 0:45 / /var/lib/kubelet/pods/with\040space rw - tmpfs tmpfs rw
`
	got := mountsBelow(mountinfo, "/var/lib/kelp", "/var/lib/kubelet", "/run/kelp")
	want := []string{
		// Deepest first; the data dir and /run/kelp themselves are left
		// mounted, and a sibling that shares a prefix is not below.
		"/run/kelp/containerd/io.containerd.grpc.v1.cri/sandboxes/abc/shm",
		"/var/lib/kubelet/pods/p/volumes/kubernetes.io~projected/token",
		"/var/lib/kelp/agent/containerd/tmpmounts/x",
		"/var/lib/kubelet/pods/with space",
	}
	if !slices.Equal(got, want) {
		t.Errorf("mountsBelow =\n%q\nwant\n%q", got, want)
	}
}

func TestEmptyDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.MkdirAll(filepath.Join(dir, "containerd", "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := emptyDir(dir, func(string) bool { return true }); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 0 {
		t.Errorf("left %v, %v; want the directory, empty", entries, err)
	}
	if err := emptyDir(filepath.Join(dir, "missing"), func(string) bool { return true }); err != nil {
		t.Errorf("a missing directory: %v", err)
	}
}

// TestRemoveCgroupsKillsLatecomers removes a node's pod cgroup that holds
// a process none of kelp killall's plans knew, as a container started
// while it read the process table: the process is killed and the cgroup
// removed.
func TestRemoveCgroupsKillsLatecomers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make cgroups")
	}
	root := fmt.Sprintf("/kelp_%012x", rand.Int64N(1<<48))
	dir := filepath.Join(cgroupsMount, "pids", root, "kubepods", "pod1")
	if _, err := os.Stat(filepath.Join(cgroupsMount, "cgroup.controllers")); err == nil {
		dir = filepath.Join(cgroupsMount, root, "kubepods", "pod1")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("no cgroup to make here: %v", err)
	}
	late := exec.Command("sleep", "600")
	if err := late.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = late.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = late.Process.Kill()
		<-exited
		for d := dir; d != cgroupsMount && d != filepath.Dir(cgroupsMount); d = filepath.Dir(d) {
			_ = os.Remove(d)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(late.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}

	if err := removeCgroups(cgroupsMount, root); err != nil {
		t.Fatalf("removeCgroups: %v", err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Error("the process in the pod cgroup still runs")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s after removeCgroups: %v, want it gone", dir, err)
	}
}

// TestStopSlices: under systemd, killall has systemd stop the node's top
// pod slice (the kubelet's systemd cgroup driver made it a unit, which a
// daemon-reload would bring back after its directory was removed);
// without systemd it asks nothing.
func TestStopSlices(t *testing.T) {
	for _, tc := range []struct {
		root    string
		systemd bool
		want    []string
	}{
		{"/", true, []string{"kubepods.slice"}},
		{"/kelp_0123abcd", true, []string{"kelp_0123abcd.slice"}},
		{"/", false, nil},
	} {
		var stopped []string
		err := stopSlices(tc.root, func() bool { return tc.systemd }, func(unit string) error {
			stopped = append(stopped, unit)
			return nil
		})
		if err != nil || !slices.Equal(stopped, tc.want) {
			t.Errorf("cgroup root %s, systemd %v: stopped %v (%v), want %v", tc.root, tc.systemd, stopped, err, tc.want)
		}
	}
	failed := stopSlices("/", func() bool { return true }, func(unit string) error { return errors.New("job failed") })
	if failed == nil || !strings.Contains(failed.Error(), "job failed") {
		t.Errorf("a slice systemd did not stop: %v, want its error", failed)
	}
}

// TestRemoveCNIResults: the CNI cache entries of the node's sandboxes go,
// those of other nodes' and runtimes' stay.
func TestRemoveCNIResults(t *testing.T) {
	root, cache := t.TempDir(), t.TempDir()
	for _, id := range []string{"aaaa1111", "bbbb2222"} {
		if err := os.MkdirAll(filepath.Join(root, "io.containerd.grpc.v1.cri", "sandboxes", id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	results := filepath.Join(cache, "results")
	if err := os.MkdirAll(results, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kelp-aaaa1111-eth0", "cni-loopback-aaaa1111-lo", "kelp-bbbb2222-eth0", "kelp-cccc3333-eth0", "podman-dddd4444-eth0"} {
		if err := os.WriteFile(filepath.Join(results, name), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := removeCNIResults(root, cache); err != nil {
		t.Fatal(err)
	}
	var left []string
	entries, _ := os.ReadDir(results)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := []string{"kelp-cccc3333-eth0", "podman-dddd4444-eth0"}; !slices.Equal(left, want) {
		t.Errorf("left %v, want %v", left, want)
	}
	// The node's entries were the last: the cache goes with them.
	for _, name := range left {
		if err := os.Remove(filepath.Join(results, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(results, "kelp-aaaa1111-eth0"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := removeCNIResults(root, cache); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cache); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the emptied cache dir stays (%v)", err)
	}
}
