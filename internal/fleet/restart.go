package fleet

import (
	"fmt"
	"os"
	"syscall"
)

// RestartError ends a kelp whose binary an upgrade replaced: main starts
// the new one (Restart).
type RestartError struct {
	// Binary is the file of the new kelp, where the running one was.
	Binary string
	// Request is the upgrade's RequestAnnotation.
	Request string
}

func (e *RestartError) Error() string {
	return fmt.Sprintf("restarting to run the kelp of upgrade %s now at %s", e.Request, e.Binary)
}

// Restart starts the new kelp of e. Under a service manager (systemd sets
// INVOCATION_ID, OpenRC RC_SVCNAME; install.sh's services restart kelp
// whenever it exits) it returns, and the caller exits non-zero for the
// manager to start the new kelp. Otherwise it replaces this process with
// the new kelp, with the same arguments and environment; it returns only
// if that fails.
func Restart(e *RestartError) error {
	if ManagedByService() {
		return nil
	}
	if err := syscall.Exec(e.Binary, os.Args, os.Environ()); err != nil {
		return fmt.Errorf("start the new kelp %s: %w: start kelp again by hand", e.Binary, err)
	}
	return nil
}

// ManagedByService says that a service manager runs this kelp and starts
// it again when it exits.
func ManagedByService() bool {
	return os.Getenv("INVOCATION_ID") != "" || os.Getenv("RC_SVCNAME") != "" || os.Getenv("SVCNAME") != ""
}
