package killall

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/procstat"
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
	p.cgroupNS, _ = os.Readlink(filepath.Join(dir, "ns", "cgroup"))
	p.netNS, _ = os.Readlink(filepath.Join(dir, "ns", "net"))
	p.exe, _ = os.Readlink(filepath.Join(dir, "exe"))
	p.cwd, _ = os.Readlink(filepath.Join(dir, "cwd"))
	p.cmdline = nulSeparated(filepath.Join(dir, "cmdline"))
	p.environ = nulSeparated(filepath.Join(dir, "environ"))
	if status, err := os.ReadFile(filepath.Join(dir, "status")); err == nil {
		p.root = rootOwned(status)
	}
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

// rootOwned tells from /proc/PID/status whether a process is root's: its
// real, effective, saved and file system uids are all 0. A set-uid program
// that a user started has a real uid of the user's.
func rootOwned(status []byte) bool {
	for _, line := range strings.Split(string(status), "\n") {
		uids, ok := strings.CutPrefix(line, "Uid:")
		if !ok {
			continue
		}
		f := strings.Fields(uids)
		for _, uid := range f {
			if uid != "0" {
				return false
			}
		}
		return len(f) == 4
	}
	return false
}

// maxConfigFile is the most killall reads of a config file; kelp's hold a
// few hundred bytes.
const maxConfigFile = 1 << 20

// configFiles is the file system at a directory as killall reads the
// config files of other processes through it: regular files of at most
// maxConfigFile (atomicfile.ReadRegular), and directories to find
// drop-ins in. Which file that is is the other process's choice: a FIFO
// would hang killall in open, a device or an endless file would have it
// read for ever.
type configFiles string

// Open opens a directory only: files are read with ReadFile.
func (dir configFiles) Open(name string) (fs.File, error) {
	path, err := dir.path("open", name)
	if err != nil {
		return nil, err
	}
	if info, err := os.Stat(path); err != nil {
		return nil, err
	} else if !info.IsDir() {
		return nil, &fs.PathError{Op: "open", Path: path, Err: errors.New("not a directory: kelp killall reads config files with ReadFile")}
	}
	return os.Open(path)
}

// Stat does not open name.
func (dir configFiles) Stat(name string) (fs.FileInfo, error) {
	path, err := dir.path("stat", name)
	if err != nil {
		return nil, err
	}
	return os.Stat(path)
}

// ReadFile reads a regular file of at most maxConfigFile.
func (dir configFiles) ReadFile(name string) ([]byte, error) {
	path, err := dir.path("read", name)
	if err != nil {
		return nil, err
	}
	data, err := atomicfile.ReadRegular(path, maxConfigFile)
	if err != nil {
		return nil, fmt.Errorf("%w: kelp killall reads only regular files of at most 1 MiB as config files", err)
	}
	return data, nil
}

func (dir configFiles) path(op, name string) (string, error) {
	if !fs.ValidPath(name) {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return filepath.Join(string(dir), name), nil
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
	st, err := procstat.Read(pid)
	return st.PPid, err == nil
}

// alive is true while pid exists and is not a zombie.
func alive(pid int) bool {
	st, err := procstat.Read(pid)
	return err == nil && st.Alive()
}
