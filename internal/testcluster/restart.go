package testcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Kill crashes the running kelp: SIGKILL to the kelp process alone, as the
// OOM killer, a crash or systemd's KillMode=process leave things.
// Whatever kelp started outlives it, as on a real machine; cleanup still
// finds it in the node's namespaces. Kill returns once the process is
// reaped, so its locks and sockets are gone and Start may run again on the
// same data dir.
func (n *Node) Kill() {
	n.t.Helper()
	if n.kelp == nil {
		n.t.Fatalf("no kelp is running on node %s", n.Name)
	}
	pid := n.kelp.Process.Pid
	// n.kelp runs nsenter, which execs kelp in place; a wrapper that forked
	// would take the signal instead and leave kelp running.
	if err := isKelp(pid, n.binary()); err != nil {
		n.t.Fatalf("kill kelp %s: %v", n.role, err)
	}
	if err := n.kelp.Process.Signal(syscall.SIGKILL); err != nil {
		n.t.Fatalf("kill kelp %s: %v", n.role, err)
	}
	select {
	case <-n.done:
		n.kelp, n.done = nil, nil
	case <-time.After(30 * time.Second):
		n.t.Fatalf("kelp %s (pid %d) still running 30 s after SIGKILL", n.role, pid)
	}
}

// isKelp says why process pid is not running binary, if it is not.
func isKelp(pid int, binary string) error {
	want, err := filepath.EvalSymlinks(binary)
	if err != nil {
		return err
	}
	want, err = filepath.Abs(want)
	if err != nil {
		return err
	}
	got, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return fmt.Errorf("process %d: %w", pid, err)
	}
	if got != want {
		return fmt.Errorf("process %d runs %s, not %s", pid, got, want)
	}
	return nil
}
