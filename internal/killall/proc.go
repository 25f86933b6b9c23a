package killall

import (
	"bytes"
	"debug/buildinfo"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
// maxConfigFile, and directories to find drop-ins in. Which file that is
// is the other process's choice: a FIFO would hang killall in open, a
// device or an endless file would have it read for ever.
type configFiles string

// Open opens a regular file or a directory.
func (dir configFiles) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	path := filepath.Join(string(dir), name)
	// Not even opened when it is no file: opening a device can do things.
	if info, err := os.Stat(path); err != nil {
		return nil, err
	} else if err := regular(info); err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	// O_NONBLOCK: should a FIFO take the file's place meanwhile, opening
	// it returns at once, and the file's own mode, read from the open
	// file, refuses it.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err == nil {
		err = regular(info)
	}
	if err != nil {
		_ = f.Close()
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return f, nil
}

// Stat does not open name.
func (dir configFiles) Stat(name string) (fs.FileInfo, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrInvalid}
	}
	return os.Stat(filepath.Join(string(dir), name))
}

// ReadFile reads a regular file of at most maxConfigFile.
func (dir configFiles) ReadFile(name string) ([]byte, error) {
	f, err := dir.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Not the size from stat: the file may grow while it is read.
	data, err := io.ReadAll(io.LimitReader(f, maxConfigFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigFile {
		return nil, &fs.PathError{Op: "read", Path: filepath.Join(string(dir), name),
			Err: fmt.Errorf("larger than %d bytes, which no kelp config file is", maxConfigFile)}
	}
	return data, nil
}

// regular refuses what is neither a regular file nor a directory.
func regular(info fs.FileInfo) error {
	if info.Mode().IsRegular() || info.IsDir() {
		return nil
	}
	return fmt.Errorf("not a regular file (mode %s): kelp killall reads only regular files as config files", info.Mode().Type())
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
