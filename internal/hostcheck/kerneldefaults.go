package hostcheck

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"k8s.io/component-helpers/node/util/sysctl"
)

// kubeletKernelDefaults are the sysctls the kubelet sets at start, or,
// with protectKernelDefaults, requires and refuses to start without.
var kubeletKernelDefaults = map[string]int{
	sysctl.VMOvercommitMemory: sysctl.VMOvercommitMemoryAlways,
	sysctl.VMPanicOnOOM:       sysctl.VMPanicOnOOMInvokeOOMKiller,
	sysctl.KernelPanic:        sysctl.KernelPanicRebootTimeout,
	sysctl.KernelPanicOnOops:  sysctl.KernelPanicOnOopsAlways,
	sysctl.RootMaxKeys:        sysctl.RootMaxKeysSetting,
	sysctl.RootMaxBytes:       sysctl.RootMaxBytesSetting,
}

// CheckKernelDefaults is the check of --protect-kernel-defaults (a CIS
// benchmark item): the kubelet then refuses to change kernel settings
// and fails if they differ from what it needs. This names every one that
// differs and how to set them for good, before the kubelet's terse error.
func (h Host) CheckKernelDefaults() error {
	var wrong, fix []string
	for _, name := range sortedKeys(kubeletKernelDefaults) {
		want := kubeletKernelDefaults[name]
		key := strings.ReplaceAll(name, "/", ".")
		raw, err := h.read("/proc/sys/" + name)
		if got, perr := strconv.Atoi(strings.TrimSpace(raw)); err != nil || perr != nil || got != want {
			have := strings.TrimSpace(raw)
			if err != nil {
				have = "unreadable"
			}
			wrong = append(wrong, fmt.Sprintf("%s is %s, want %d", key, have, want))
			fix = append(fix, fmt.Sprintf("%s=%d", key, want))
		}
	}
	if len(wrong) == 0 {
		return nil
	}
	return fmt.Errorf("--protect-kernel-defaults: the kubelet may not change these kernel settings and would refuse to start: %s. "+
		"Set them for good: write the lines %q to /etc/sysctl.d/90-kelp.conf and run `sysctl --system`; or start without --protect-kernel-defaults and the kubelet sets them itself",
		strings.Join(wrong, "; "), strings.Join(fix, "\n"))
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
