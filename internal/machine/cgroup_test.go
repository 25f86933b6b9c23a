package machine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeV2 makes a cgroup v2 tree under a temp dir: each cgroup in dirs
// with the given cgroup.controllers and an empty cgroup.subtree_control,
// which records what is written to it (the kernel would enable them).
func fakeV2(t *testing.T, controllers map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for dir, ctrl := range controllers {
		path := filepath.Join(root, dir)
		if err := os.MkdirAll(path, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(path, "cgroup.controllers"), []byte(ctrl+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(path, "cgroup.subtree_control"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestDelegateV2 checks that every cgroup from the v2 root down to a
// machine's parent passes on all its controllers, as a systemd scope with
// Delegate=yes or a parent made at the root must for the kubelet of a
// machine below it, and nothing above the root is touched.
func TestDelegateV2(t *testing.T) {
	root := fakeV2(t, map[string]string{
		".":                                     "cpuset cpu io memory hugetlb pids rdma misc",
		"system.slice":                          "cpuset cpu io memory pids",
		"system.slice/kelp-cluster-ci.scope":    "cpuset cpu io memory pids",
		"system.slice/kelp-cluster-ci.scope/ci": "cpu memory pids",
	})
	parent := filepath.Join(root, "system.slice", "kelp-cluster-ci.scope")
	if err := delegate(root, parent); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{
		".":                                     "+misc", // one write per controller: the file holds the last
		"system.slice":                          "+pids",
		"system.slice/kelp-cluster-ci.scope":    "+pids",
		"system.slice/kelp-cluster-ci.scope/ci": "",
	} {
		got, _ := os.ReadFile(filepath.Join(root, dir, "cgroup.subtree_control"))
		if string(got) != want {
			t.Errorf("%s/cgroup.subtree_control: %q, want %q", dir, got, want)
		}
	}
	if err := delegate(root, filepath.Join(root, "..", "elsewhere")); err == nil || !strings.Contains(err.Error(), "not below") {
		t.Errorf("a parent outside the hierarchy: %v", err)
	}
}

// TestDelegateV2Refused: a parent that cannot pass memory on (its
// cgroup.subtree_control refuses the write, as the kernel does for a
// cgroup that holds processes) is named, with what to do.
func TestDelegateV2Refused(t *testing.T) {
	root := fakeV2(t, map[string]string{".": "cpu memory pids", "busy": "cpu memory pids"})
	// A directory in its place refuses every write, root's too.
	control := filepath.Join(root, "busy", "cgroup.subtree_control")
	if err := os.Remove(control); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(control, 0o755); err != nil {
		t.Fatal(err)
	}
	err := delegate(root, filepath.Join(root, "busy"))
	if err == nil || !strings.Contains(err.Error(), "does not pass on the controllers cpu, memory, pids") || !strings.Contains(err.Error(), "Delegate=yes") {
		t.Fatalf("got %v", err)
	}
}
