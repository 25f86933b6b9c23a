package killall

import (
	"bytes"
	"debug/buildinfo"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// readProcesses reads the process table from /proc. A process that ends
// while it is read is left out.
func readProcesses() ([]process, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var procs []process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProcess(pid); ok {
			procs = append(procs, p)
		}
	}
	return procs, nil
}

// readProcess reads what killall needs of pid; false if pid is gone.
// Kernel threads have no exe, command line or environment.
func readProcess(pid int) (process, bool) {
	ppid, ok := parentOf(pid)
	if !ok {
		return process{}, false
	}
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	p := process{pid: pid, ppid: ppid}
	p.mountNS, _ = os.Readlink(filepath.Join(dir, "ns", "mnt"))
	p.exe, _ = os.Readlink(filepath.Join(dir, "exe"))
	p.cwd, _ = os.Readlink(filepath.Join(dir, "cwd"))
	p.cmdline = nulSeparated(filepath.Join(dir, "cmdline"))
	p.environ = nulSeparated(filepath.Join(dir, "environ"))
	if p.exe != "" {
		if info, err := buildinfo.ReadFile(filepath.Join(dir, "exe")); err == nil {
			p.program = info.Path
		}
	}
	return p, true
}

// nulSeparated reads a /proc file of NUL-terminated strings.
func nulSeparated(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil || len(data) == 0 {
		return nil
	}
	return strings.Split(string(bytes.TrimSuffix(data, []byte{0})), "\x00")
}

// resolveSymlinks returns path with its symlinks resolved, or path when it
// cannot be (it no longer exists, say).
func resolveSymlinks(path string) string {
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		return resolved
	}
	return path
}

func parentOf(pid int) (int, bool) {
	f, ok := statFields(pid)
	if !ok || len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// alive is true while pid exists and is not a zombie.
func alive(pid int) bool {
	f, ok := statFields(pid)
	return ok && len(f) > 0 && f[0] != "Z"
}

// statFields are the fields of /proc/PID/stat after the command name,
// which may hold spaces: the state first, then the parent.
func statFields(pid int) ([]string, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, false
	}
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return nil, false
	}
	return strings.Fields(string(data[end+1:])), true
}
