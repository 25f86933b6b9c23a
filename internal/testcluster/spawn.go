package testcluster

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// Every child is started from one OS thread that lives as long as the test
// binary. Pdeathsig fires when the thread that forked a child exits, not
// the process; starting children from any goroutine would let Go retire
// that thread (inNetns discards threads on purpose) and kill the child. With
// one long-lived thread, children die with the test binary, also when a test
// times out and no cleanup runs.
var (
	spawnOnce sync.Once
	spawnc    chan func()
)

// Spawn starts cmd so that it dies with the test binary.
func Spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnc = make(chan func())
		go func() {
			runtime.LockOSThread()
			for fn := range spawnc {
				fn()
			}
		}()
	})
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	errc := make(chan error, 1)
	spawnc <- func() { errc <- cmd.Start() }
	return <-errc
}
