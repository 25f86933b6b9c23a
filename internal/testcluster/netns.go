package testcluster

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// InNewNetns runs fn on a thread in a network namespace of its own, so a
// kernel test never touches the machine's interfaces, routes or nftables.
// The thread is discarded after, and the namespace with it.
func InNewNetns(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: Go retires the thread
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare: %v", err)
			return
		}
		fn()
	}()
	<-done
}
