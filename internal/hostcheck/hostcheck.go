package hostcheck

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Status grades one check.
type Status string

const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "FAIL"
)

// Result is one line of the report.
type Result struct {
	Name   string
	Status Status
	Detail string
	Fix    string // what to do; empty when Status is OK
}

// Host reads the facts from a root directory: "/" on a real machine, a
// prepared tree in tests.
type Host struct {
	Root string
}

func (h Host) path(p string) string { return filepath.Join(h.Root, p) }

func (h Host) read(p string) (string, error) {
	data, err := os.ReadFile(h.path(p))
	return string(data), err
}

// Check runs every check.
func (h Host) Check() []Result {
	kconfig := h.kernelConfig()
	results := []Result{h.cgroupVersion()}
	results = append(results, h.cgroupControllers()...)
	results = append(results,
		h.cgroupsWritable(),
		h.kmsg(),
		h.overlay(),
		h.kernelFeature(kconfig, "nf_tables", Fail, "pod masquerade, Services and NetworkPolicy", []string{"NF_TABLES", "NFT_NAT", "NFT_MASQ"}, "nf_tables"),
		h.kernelFeature(kconfig, "bridge", Fail, "the pod network bridge cni0", []string{"BRIDGE"}, "bridge"),
		h.kernelFeature(kconfig, "veth", Fail, "pod network interfaces", []string{"VETH"}, "veth"),
		h.kernelFeature(kconfig, "vxlan", Warn, "the overlay between nodes", []string{"VXLAN"}, "vxlan"),
		h.brNetfilter(),
		h.ipForward(),
		h.swap(),
	)
	return results
}

// Failures returns an error listing every failed check with its fix, or
// nil when nothing failed.
func Failures(results []Result) error {
	var errs []error
	for _, r := range results {
		if r.Status == Fail {
			errs = append(errs, fmt.Errorf("%s: %s; %s", r.Name, r.Detail, r.Fix))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("this host cannot run a kelp node (run `kelp check-config` for the full report):\n%w", errors.Join(errs...))
}

// Print writes the report, one check per line, fixes indented below.
func Print(w io.Writer, results []Result) {
	for _, r := range results {
		fmt.Fprintf(w, "%-5s %-22s %s\n", r.Status, r.Name, r.Detail)
		if r.Fix != "" {
			fmt.Fprintf(w, "      %-22s fix: %s\n", "", r.Fix)
		}
	}
}

// CgroupV2 reports whether the unified hierarchy is mounted at
// /sys/fs/cgroup.
func (h Host) CgroupV2() bool {
	_, err := os.Stat(h.path("/sys/fs/cgroup/cgroup.controllers"))
	return err == nil
}

func (h Host) cgroupVersion() Result {
	if h.CgroupV2() {
		return Result{Name: "cgroup version", Status: OK, Detail: "v2"}
	}
	return Result{Name: "cgroup version", Status: Warn, Detail: "v1 (deprecated by Kubernetes; kelp runs the kubelet with failCgroupV1: false)",
		Fix: "boot with systemd.unified_cgroup_hierarchy=1 on the kernel command line to use cgroup v2"}
}

func (h Host) cgroupControllers() []Result {
	enabled, err := h.enabledControllers()
	if err != nil {
		return []Result{{Name: "cgroup controllers", Status: Fail, Detail: err.Error(), Fix: "mount cgroups at /sys/fs/cgroup (your init system normally does)"}}
	}
	var out []Result
	for _, c := range []struct {
		name   string
		status Status
		fix    string
	}{
		{"memory", Fail, "add cgroup_enable=memory cgroup_memory=1 to the kernel command line (on a Raspberry Pi: /boot/firmware/cmdline.txt or /boot/cmdline.txt) and reboot"},
		{"cpu", Fail, "use a kernel built with CONFIG_CGROUP_SCHED"},
		{"cpuset", Warn, "add cgroup_enable=cpuset to the kernel command line and reboot"},
		{"pids", Warn, "use a kernel built with CONFIG_CGROUP_PIDS; without it pod PID limits are not enforced"},
	} {
		r := Result{Name: "cgroup " + c.name, Status: OK, Detail: "enabled"}
		if !enabled[c.name] {
			r.Status, r.Detail, r.Fix = c.status, "not enabled", c.fix
		}
		out = append(out, r)
	}
	return out
}

func (h Host) enabledControllers() (map[string]bool, error) {
	enabled := map[string]bool{}
	if h.CgroupV2() {
		data, err := h.read("/sys/fs/cgroup/cgroup.controllers")
		if err != nil {
			return nil, err
		}
		for _, c := range strings.Fields(data) {
			enabled[c] = true
		}
		return enabled, nil
	}
	data, err := h.read("/proc/cgroups")
	if err != nil {
		return nil, fmt.Errorf("read cgroup controllers: %w", err)
	}
	for _, line := range strings.Split(data, "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && !strings.HasPrefix(f[0], "#") && f[3] == "1" {
			enabled[f[0]] = true
		}
	}
	return enabled, nil
}

// cgroupsWritable fails where /sys/fs/cgroup is mounted read-only, as in
// a container run without --privileged: the kubelet could not make the
// pods' cgroups and would stop kelp in the middle of its start.
func (h Host) cgroupsWritable() Result {
	dirs := []string{h.path("/sys/fs/cgroup")}
	if !h.CgroupV2() {
		dirs, _ = filepath.Glob(h.path("/sys/fs/cgroup/*/cgroup.procs"))
		for i, procs := range dirs {
			dirs[i] = filepath.Dir(procs)
		}
	}
	for _, dir := range dirs {
		if err := unix.Access(dir, unix.W_OK); errors.Is(err, unix.EROFS) {
			return Result{Name: "cgroups writable", Status: Fail, Detail: dir + " is read-only; the kubelet makes the pods' cgroups there",
				Fix: "mount /sys/fs/cgroup read-write; in a container, run it with --privileged"}
		}
	}
	return Result{Name: "cgroups writable", Status: OK, Detail: "yes"}
}

// kmsg fails without /dev/kmsg, which the kubelet reads the kernel's OOM
// kills from and does not start without.
func (h Host) kmsg() Result {
	if _, err := os.Stat(h.path("/dev/kmsg")); err != nil {
		return Result{Name: "/dev/kmsg", Status: Fail, Detail: "missing; the kubelet reads the kernel's OOM kills there and does not start without it",
			Fix: "in a container, run it with --privileged (or --device /dev/kmsg)"}
	}
	return Result{Name: "/dev/kmsg", Status: OK, Detail: "present"}
}

func (h Host) overlay() Result {
	data, _ := h.read("/proc/filesystems")
	for _, line := range strings.Split(data, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == "overlay" {
			return Result{Name: "overlayfs", Status: OK, Detail: "available"}
		}
	}
	return Result{Name: "overlayfs", Status: Warn, Detail: "not available; containerd falls back to the native snapshotter (slower, uses more disk)",
		Fix: "use a kernel with CONFIG_OVERLAY_FS"}
}

// kernelConfig returns the running kernel's build options (CONFIG_X=y|m),
// or nil when the kernel does not publish them.
func (h Host) kernelConfig() map[string]string {
	var text []byte
	if f, err := os.Open(h.path("/proc/config.gz")); err == nil {
		defer f.Close()
		if zr, err := gzip.NewReader(f); err == nil {
			text, _ = io.ReadAll(zr)
		}
	}
	if text == nil {
		release, _ := h.read("/proc/sys/kernel/osrelease")
		text, _ = os.ReadFile(h.path("/boot/config-" + strings.TrimSpace(release)))
	}
	if text == nil {
		return nil
	}
	config := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && strings.HasPrefix(k, "CONFIG_") {
			config[strings.TrimPrefix(k, "CONFIG_")] = v
		}
	}
	return config
}

// kernelFeature checks build options when the kernel publishes them, and
// a loaded module otherwise.
func (h Host) kernelFeature(kconfig map[string]string, name string, missing Status, usedFor string, options []string, module string) Result {
	fix := fmt.Sprintf("use a kernel with CONFIG_%s (y or m)", strings.Join(options, ", CONFIG_"))
	if _, err := os.Stat(h.path("/sys/module/" + module)); err == nil {
		return Result{Name: name, Status: OK, Detail: "loaded"}
	}
	if kconfig == nil {
		return Result{Name: name, Status: Warn, Detail: "unknown: the kernel publishes no build options and the module is not loaded; needed for " + usedFor, Fix: fix}
	}
	var absent []string
	for _, o := range options {
		if v := kconfig[o]; v != "y" && v != "m" {
			absent = append(absent, "CONFIG_"+o)
		}
	}
	if len(absent) > 0 {
		return Result{Name: name, Status: missing, Detail: fmt.Sprintf("missing %s; needed for %s", strings.Join(absent, ", "), usedFor), Fix: fix}
	}
	return Result{Name: name, Status: OK, Detail: "built in or available as a module"}
}

func (h Host) brNetfilter() Result {
	if _, err := os.Stat(h.path("/proc/sys/net/bridge/bridge-nf-call-iptables")); err == nil {
		return Result{Name: "br_netfilter", Status: OK, Detail: "enabled"}
	}
	return Result{Name: "br_netfilter", Status: Warn, Detail: "not loaded; pods on one node may bypass Service and NetworkPolicy rules",
		Fix: "modprobe br_netfilter, and add it to /etc/modules-load.d/kelp.conf"}
}

func (h Host) ipForward() Result {
	v, err := h.read("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		return Result{Name: "ip_forward", Status: Fail, Detail: "cannot read net.ipv4.ip_forward: " + err.Error(), Fix: "use a kernel with IPv4 networking"}
	}
	if strings.TrimSpace(v) == "1" {
		return Result{Name: "ip_forward", Status: OK, Detail: "on"}
	}
	return Result{Name: "ip_forward", Status: OK, Detail: "off now; kelp turns it on when the node starts"}
}

func (h Host) swap() Result {
	data, _ := h.read("/proc/swaps")
	lines := strings.Split(strings.TrimSpace(data), "\n")
	if len(lines) <= 1 {
		return Result{Name: "swap", Status: OK, Detail: "off"}
	}
	return Result{Name: "swap", Status: Warn, Detail: "on; the kubelet runs and keeps pods out of swap",
		Fix: "swapoff -a (and remove swap from /etc/fstab) for predictable pod memory"}
}
