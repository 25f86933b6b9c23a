package containerinit

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const cgroupRoot = "/sys/fs/cgroup"

// Run is what kelp does as PID 1: it moves itself out of the cgroup v2
// root, starts kelp again as its child with the same arguments and
// environment, passes signals on to it, reaps every process that ends up
// its child, and returns the child's exit code. A Go program cannot
// safely reap children it did not start in the process that also waits
// for its own (containerd, exec.Cmd): hence the second process.
func Run() int {
	if err := evacuateCgroup2(cgroupRoot); err != nil {
		fmt.Fprintln(os.Stderr, "kelp:", err)
		return 1
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kelp: find the kelp binary:", err)
		return 1
	}
	pid, err := syscall.ForkExec(self, os.Args, &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kelp: start kelp under PID 1:", err)
		return 1
	}
	for sig := range signals {
		if sig != unix.SIGCHLD {
			_ = unix.Kill(pid, sig.(syscall.Signal))
			continue
		}
		for {
			var status unix.WaitStatus
			reaped, err := unix.Wait4(-1, &status, unix.WNOHANG, nil)
			if reaped <= 0 || err != nil {
				break
			}
			if reaped != pid {
				continue
			}
			// What is left dies with PID 1, as the kernel kills the
			// rest of the PID namespace.
			if status.Signaled() {
				return 128 + int(status.Signal())
			}
			return status.ExitStatus()
		}
	}
	return 1
}

// evacuateCgroup2 moves every process of the cgroup v2 root (kelp alone,
// as PID 1) into a child cgroup "init" and enables every controller for
// the root's children, as kind's and k3s's images do: a cgroup v2 cgroup
// with processes in it cannot pass controllers on to its children, so the
// kubelet could not make kubepods. On cgroup v1, or below the root, there
// is nothing to do.
func evacuateCgroup2(root string) error {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		return nil
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil || strings.TrimSpace(string(own)) != "0::/" {
		return nil
	}
	procs, err := os.ReadFile(filepath.Join(root, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("read the cgroup root: %w", err)
	}
	init := filepath.Join(root, "init")
	if err := os.Mkdir(init, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("make cgroup %s (is /sys/fs/cgroup writable? run the container with --privileged): %w", init, err)
	}
	for _, p := range strings.Fields(string(procs)) {
		if err := os.WriteFile(filepath.Join(init, "cgroup.procs"), []byte(p), 0o644); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("move process %s to cgroup %s: %w", p, init, err)
		}
	}
	controllers, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return err
	}
	var enable []string
	for _, c := range strings.Fields(string(controllers)) {
		enable = append(enable, "+"+c)
	}
	if len(enable) == 0 {
		return nil
	}
	if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0o644); err != nil {
		return fmt.Errorf("enable cgroup controllers %s: %w", strings.Join(enable, " "), err)
	}
	return nil
}
