package killall

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
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
