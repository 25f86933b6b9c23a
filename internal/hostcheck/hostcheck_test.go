package hostcheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeHost builds a root tree holding files (path → content).
func fakeHost(t *testing.T, files map[string]string) Host {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return Host{Root: root}
}

const (
	cgroupsV1   = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t1\t1\ncpu\t1\t1\t1\nmemory\t4\t1\t1\npids\t8\t1\t1\n"
	fullKconfig = "CONFIG_NF_TABLES=y\nCONFIG_NFT_NAT=m\nCONFIG_NFT_MASQ=y\nCONFIG_BRIDGE=y\nCONFIG_VETH=m\nCONFIG_VXLAN=y\n"
)

func healthy() map[string]string {
	return map[string]string{
		"/proc/cgroups":                                cgroupsV1,
		"/proc/filesystems":                            "nodev\tsysfs\nnodev\toverlay\n",
		"/proc/sys/kernel/osrelease":                   "6.1.0-test\n",
		"/boot/config-6.1.0-test":                      fullKconfig,
		"/proc/sys/net/bridge/bridge-nf-call-iptables": "1\n",
		"/proc/sys/net/ipv4/ip_forward":                "0\n",
		"/proc/swaps":                                  "Filename\tType\tSize\tUsed\tPriority\n",
		"/dev/kmsg":                                    "",
	}
}

func find(t *testing.T, results []Result, name string) Result {
	t.Helper()
	for _, r := range results {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no check named %q in %v", name, results)
	return Result{}
}

func TestHealthyHostHasNoFailures(t *testing.T) {
	results := fakeHost(t, healthy()).Check()
	if err := Failures(results); err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Status != OK && r.Name != "cgroup version" {
			t.Errorf("%s: %s %s", r.Name, r.Status, r.Detail)
		}
	}
}

func TestMissingMemoryCgroupFailsWithThePiFix(t *testing.T) {
	files := healthy()
	files["/proc/cgroups"] = strings.Replace(cgroupsV1, "memory\t4\t1\t1", "memory\t0\t1\t0", 1)
	results := fakeHost(t, files).Check()
	r := find(t, results, "cgroup memory")
	if r.Status != Fail || !strings.Contains(r.Fix, "cgroup_enable=memory cgroup_memory=1") {
		t.Fatalf("got %+v", r)
	}
	err := Failures(results)
	if err == nil || !strings.Contains(err.Error(), "cgroup_enable=memory") {
		t.Fatalf("Failures = %v", err)
	}
}

func TestCgroupV2Controllers(t *testing.T) {
	files := healthy()
	delete(files, "/proc/cgroups")
	files["/sys/fs/cgroup/cgroup.controllers"] = "cpuset cpu io pids\n"
	results := fakeHost(t, files).Check()
	if r := find(t, results, "cgroup version"); r.Status != OK || r.Detail != "v2" {
		t.Errorf("version: %+v", r)
	}
	if r := find(t, results, "cgroup memory"); r.Status != Fail {
		t.Errorf("memory: %+v", r)
	}
	if r := find(t, results, "cgroup cpu"); r.Status != OK {
		t.Errorf("cpu: %+v", r)
	}
}

func TestKernelFeatures(t *testing.T) {
	files := healthy()
	files["/boot/config-6.1.0-test"] = strings.Replace(strings.Replace(fullKconfig, "CONFIG_NFT_MASQ=y", "# CONFIG_NFT_MASQ is not set", 1), "CONFIG_VXLAN=y", "", 1)
	files["/proc/swaps"] += "/swapfile\tfile\t1024\t0\t-2\n"
	delete(files, "/proc/filesystems")
	results := fakeHost(t, files).Check()
	for name, want := range map[string]Status{"nf_tables": Fail, "vxlan": Warn, "bridge": OK, "swap": Warn, "overlayfs": Warn} {
		if r := find(t, results, name); r.Status != want {
			t.Errorf("%s: %s (%s), want %s", name, r.Status, r.Detail, want)
		}
	}
	if r := find(t, results, "nf_tables"); !strings.Contains(r.Detail, "CONFIG_NFT_MASQ") {
		t.Errorf("nf_tables detail %q does not name the missing option", r.Detail)
	}
}

func TestLoadedModuleCountsWithoutKernelConfig(t *testing.T) {
	files := healthy()
	delete(files, "/boot/config-6.1.0-test")
	files["/sys/module/bridge/uevent"] = ""
	results := fakeHost(t, files).Check()
	if r := find(t, results, "bridge"); r.Status != OK {
		t.Errorf("bridge: %+v", r)
	}
	if r := find(t, results, "veth"); r.Status != Warn || !strings.HasPrefix(r.Detail, "unknown") {
		t.Errorf("veth: %+v", r)
	}
}

func TestMissingKmsgFails(t *testing.T) {
	files := healthy()
	delete(files, "/dev/kmsg")
	r := find(t, fakeHost(t, files).Check(), "/dev/kmsg")
	if r.Status != Fail || !strings.Contains(r.Fix, "--privileged") {
		t.Errorf("without /dev/kmsg: %+v, want a failure that says --privileged", r)
	}
}
