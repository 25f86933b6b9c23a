package component

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/sirupsen/logrus"
)

// ErrStopped ends a start-up that was asked to stop: not a failure.
var ErrStopped = errors.New("stopped during start-up")

const (
	// ReadyTimeout bounds each readiness wait of Run's group. It is long:
	// a start that ends at the bound begins again under the service
	// manager, doing the same work, so a bound that a slow machine (an
	// SD card, a board beside its real workload, a VM under emulation) can
	// reach makes it restart for ever; at 2 minutes, kelp never became
	// ready in the VM lab under load. A piece that fails says so at once;
	// the bound is for one that hangs. Meanwhile Start says what it waits
	// for every ProgressEvery.
	ReadyTimeout = 10 * time.Minute
	// ProgressEvery is how often a readiness wait says that it still waits.
	ProgressEvery = 30 * time.Second
	// StopTimeout bounds Run's whole shutdown, as after SIGTERM.
	StopTimeout = 10 * time.Second
)

// Run is the life of a kelp process, named in its last log line: start adds the pieces to a new group,
// then Run blocks until ctx ends (nil) or a piece fails (its error). Either
// way, and also when start fails, every piece started is stopped, within
// StopTimeout. A stop asked for during start-up is not a failure.
func Run(ctx context.Context, name string, log *logrus.Entry, start func(context.Context, *Group) error, opts ...GroupOption) error {
	socket := takeNotifySocket()
	g := NewGroup(ctx, ReadyTimeout, opts...)
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), StopTimeout)
		defer cancel()
		if err := g.Stop(stopCtx); err != nil {
			log.WithError(err).Error("stop")
		}
		log.Info(name + " stopped")
	}()
	if err := start(ctx, g); err != nil {
		if errors.Is(err, ErrStopped) || ctx.Err() != nil {
			log.Info("stop requested during start-up")
			return nil
		}
		return err
	}
	// A service manager that started kelp (systemd's Type=notify) learns
	// that it runs; without one there is no socket and nothing is sent.
	notify(log, socket, daemon.SdNotifyReady)
	defer notify(log, socket, daemon.SdNotifyStopping)
	return g.Wait()
}

// takeNotifySocket returns the service manager's notify socket and takes
// it out of the environment. The in-process kube-apiserver
// (k8s.io/apiserver) sends READY=1 as soon as it serves and then unsets
// the variable: under systemd, kelp was reported started minutes before it
// was ready, and its own READY=1 and STOPPING=1 went nowhere. Children
// (containerd) have no business with it either.
func takeNotifySocket() string {
	socket := os.Getenv("NOTIFY_SOCKET")
	_ = os.Unsetenv("NOTIFY_SOCKET")
	return socket
}

// notify sends state to socket, as sd_notify(3) does; without a socket
// (no service manager) it sends nothing.
func notify(log *logrus.Entry, socket, state string) {
	if socket == "" {
		return
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err == nil {
		_, err = conn.Write([]byte(state))
		conn.Close()
	}
	if err != nil {
		log.WithError(err).Warn("tell the service manager " + state)
	}
}

// Group runs pieces started in order and stops them in reverse.
type Group struct {
	until        context.Context
	readyTimeout time.Duration
	stopReserve  time.Duration
	progress     time.Duration // between two "still waiting" lines

	pieces   []Component // in start order; only the goroutine that starts and stops touches it
	failed   chan error  // fan-in of the pieces' Err, named
	stopping chan struct{}
	stopOnce sync.Once
}

// GroupOption changes a Group.
type GroupOption func(*Group)

// StopReserve keeps d of Stop's deadline for the first piece started,
// which stops last: the datastore, which must close cleanly however long
// the others took.
func StopReserve(d time.Duration) GroupOption {
	return func(g *Group) { g.stopReserve = d }
}

// Progress makes a readiness wait say every d that it still waits
// (default ProgressEvery).
func Progress(d time.Duration) GroupOption {
	return func(g *Group) { g.progress = d }
}

// NewGroup makes a Group whose start-up ends with ErrStopped once until
// ends, and whose readiness waits each last at most readyTimeout.
func NewGroup(until context.Context, readyTimeout time.Duration, opts ...GroupOption) *Group {
	g := &Group{until: until, readyTimeout: readyTimeout, progress: ProgressEvery, failed: make(chan error), stopping: make(chan struct{})}
	for _, o := range opts {
		o(g)
	}
	return g
}

// Start takes a piece from its constructor (a failed constructor's error
// is returned as it is) and waits until the piece is ready. The wait ends
// early with the error of any piece of the group that fails meanwhile, or
// with ErrStopped when the group's context ends. Whatever Start returns,
// the piece is the group's to stop.
func (g *Group) Start(c Component, err error) error {
	if err != nil {
		return err
	}
	g.pieces = append(g.pieces, c)
	go g.forward(c)
	began := time.Now()
	timeout := time.NewTimer(g.readyTimeout)
	defer timeout.Stop()
	progress := time.NewTicker(g.progress)
	defer progress.Stop()
	for {
		select {
		case <-c.Ready():
			logrus.WithField("component", c.Name()).WithField("took", time.Since(began).Round(time.Millisecond)).Debug("ready")
			return nil
		case err := <-g.failed:
			return err
		case <-g.until.Done():
			return ErrStopped
		case <-progress.C:
			logrus.WithField("component", c.Name()).WithField("waited", time.Since(began).Round(time.Second)).
				Info(fmt.Sprintf("waiting for %s to be ready%s; kelp gives up after %s", c.Name(), lastReason(c), g.readyTimeout))
		case <-timeout.C:
			return fmt.Errorf("%s not ready after %s%s", c.Name(), g.readyTimeout, lastReason(c))
		}
	}
}

// lastReason is why c is not ready, as it last said, for a message.
func lastReason(c Component) string {
	if nr, ok := c.(notReady); ok && nr.NotReady() != nil {
		return fmt.Sprintf(" (last: %v)", nr.NotReady())
	}
	return ""
}

// Go starts fn as a piece of the group (see Go and Start).
func (g *Group) Go(name string, fn func(context.Context) error, opts ...Option) error {
	return g.Start(Go(name, fn, opts...), nil)
}

// forward passes c's failure, named, to whoever waits on the group.
func (g *Group) forward(c Component) {
	select {
	case err := <-c.Err():
		select {
		case g.failed <- fmt.Errorf("%s: %w", c.Name(), err):
		case <-g.stopping:
		}
	case <-g.stopping:
	}
}

// Wait blocks until a piece fails, returning its error, or until the
// group's context ends, returning nil.
func (g *Group) Wait() error {
	select {
	case err := <-g.failed:
		return err
	case <-g.until.Done():
		return nil
	}
}

// Stop stops every piece, the last started first, within ctx. A piece that
// does not stop in time does not keep the others from stopping. Errors
// name their piece.
func (g *Group) Stop(ctx context.Context) error {
	g.stopOnce.Do(func() { close(g.stopping) })
	var errs []error
	for i := len(g.pieces) - 1; i >= 0; i-- {
		c := g.pieces[i]
		pieceCtx, cancel := ctx, context.CancelFunc(func() {})
		if deadline, ok := ctx.Deadline(); ok && i > 0 && g.stopReserve > 0 {
			pieceCtx, cancel = context.WithDeadline(ctx, deadline.Add(-g.stopReserve))
		}
		if err := c.Stop(pieceCtx); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", c.Name(), err))
		}
		cancel()
	}
	return errors.Join(errs...)
}
