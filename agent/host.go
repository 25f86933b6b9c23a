package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/hostcheck"
)

// tools are the programs the kelp binary also is, under the names users
// look for.
var tools = []string{"crictl", "ctr", "kubectl"}

// linkTools points each tool name in dir at the kelp binary.
func linkTools(dir, self string) error {
	for _, name := range tools {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == self {
			continue
		}
		if err := atomicfile.Symlink(self, link); err != nil {
			return err
		}
	}
	return nil
}

// systemdCgroups decides the cgroup driver of containerd and the kubelet:
// systemd's where systemd runs the host on cgroup v2, cgroupfs otherwise.
func systemdCgroups(host hostcheck.Host) bool {
	_, err := os.Stat("/run/systemd/system")
	return err == nil && host.CgroupV2()
}

// hostResolvConf is the resolv.conf pods inherit upstream servers from.
// Where systemd-resolved runs, /etc/resolv.conf names its stub on
// 127.0.0.53, which a pod cannot reach; the real servers are elsewhere.
func hostResolvConf() string {
	const resolved = "/run/systemd/resolve/resolv.conf"
	if data, err := os.ReadFile("/etc/resolv.conf"); err == nil && strings.Contains(string(data), "127.0.0.53") {
		if _, err := os.Stat(resolved); err == nil {
			return resolved
		}
	}
	return "/etc/resolv.conf"
}

// hasSysResource reports whether kelp may lower OOM scores below its own,
// which the kubelet asks for critical pods. Inside a container or a
// sandbox it often may not.
func hasSysResource() bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && caps&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return false
}
