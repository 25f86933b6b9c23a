package hostcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// IPv6Conf is where the kernel keeps IPv6 settings per interface; it is
// missing on a kernel booted with ipv6.disable=1.
const IPv6Conf = "/proc/sys/net/ipv6/conf"

// IPv6Off reports whether IPv6 is off for iface ("all", "default", "lo",
// or a link's name): its disable_ipv6 is set, or the kernel has no IPv6.
func IPv6Off(iface string) (bool, error) {
	data, err := os.ReadFile(filepath.Join(IPv6Conf, iface, "disable_ipv6"))
	if errors.Is(err, fs.ErrNotExist) && !KernelHasIPv6() {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("is IPv6 on for %s: %w", iface, err)
	}
	return strings.TrimSpace(string(data)) != "0", nil
}

// KernelHasIPv6 reports whether the kernel runs IPv6 at all (not booted
// with ipv6.disable=1).
func KernelHasIPv6() bool {
	_, err := os.Stat(IPv6Conf)
	return err == nil
}
