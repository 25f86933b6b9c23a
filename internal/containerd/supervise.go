package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/layout"
)

const (
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
	// stableAfter is how long containerd must run before a crash counts as
	// new trouble again and the backoff starts over.
	stableAfter = time.Minute
)

var log = logrus.WithField("component", "containerd")

var _ component.Component = (*Supervisor)(nil)

// Supervisor keeps one containerd child process running, restarting it
// with backoff when it dies, until Stop. It is ready once containerd
// answers; a crash is not a failure of the node, so Err never delivers.
type Supervisor struct {
	*component.Readiness

	args     []string
	env      []string
	logPath  string
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	mu   sync.Mutex
	proc *os.Process // the current containerd
}

// Supervise starts `<binary> --config <configPath>`, the bundle's
// containerd, and keeps it running. Its output goes to logPath; env is its
// environment.
func Supervise(binary, configPath, logPath string, env []string) (*Supervisor, error) {
	s := &Supervisor{
		args:    []string{binary, "--config", configPath},
		env:     env,
		logPath: logPath,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	out, err := s.openLog()
	if err != nil {
		return nil, err
	}
	proc, err := s.spawn(out)
	if err != nil {
		return nil, err
	}
	s.proc = proc
	go s.run()
	s.Readiness = component.PollReady(answers(layout.ContainerdAddress), s.stop)
	return s, nil
}

// Name names containerd in the node's lifecycle.
func (s *Supervisor) Name() string { return "containerd" }

// Err never delivers: containerd is restarted rather than reported.
func (s *Supervisor) Err() <-chan error { return nil }

// NotReady says why containerd does not answer yet.
func (s *Supervisor) NotReady() error {
	if err := s.Readiness.NotReady(); err != nil {
		return fmt.Errorf("%w; see %s", err, s.logPath)
	}
	return nil
}

// answers is a probe: containerd answers on address.
func answers(address string) func(context.Context) error {
	return func(ctx context.Context) error {
		c, err := client.New(address, client.WithTimeout(time.Second))
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err = c.Version(ctx)
		return err
	}
}

func (s *Supervisor) openLog() (*os.File, error) {
	f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("containerd log: %w", err)
	}
	return f, nil
}

// spawn starts containerd from a thread that lives as long as the process:
// the child's parent-death signal fires when the spawning thread exits, and
// containerd must outlive every thread but the process itself.
func (s *Supervisor) spawn(out *os.File) (*os.Process, error) {
	defer out.Close()
	type result struct {
		proc *os.Process
		err  error
	}
	ch := make(chan result, 1)
	spawnerOnce.Do(func() { go spawner() })
	spawnRequests <- func() {
		cmd := exec.Command(s.args[0], s.args[1:]...)
		cmd.Env = s.env
		cmd.Stdout, cmd.Stderr = out, out
		// Its own process group keeps a Ctrl-C in kelp's terminal from
		// reaching containerd before kelp stops it; the death signal takes
		// it down with a crashed kelp, so a restart finds its socket free.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		err := cmd.Start()
		ch <- result{cmd.Process, err}
	}
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("start containerd: %w", r.err)
	}
	return r.proc, nil
}

var (
	spawnerOnce   sync.Once
	spawnRequests = make(chan func())
)

// spawner runs the functions sent to spawnRequests on one thread that is
// never unlocked, so it lives as long as the process.
func spawner() {
	runtime.LockOSThread()
	for f := range spawnRequests {
		f()
	}
}

func (s *Supervisor) run() {
	defer close(s.done)
	backoff := minBackoff
	for {
		s.mu.Lock()
		proc := s.proc
		s.mu.Unlock()
		began := time.Now()
		exited := make(chan error, 1)
		go func() { _, err := proc.Wait(); exited <- err }()
		select {
		case <-s.stop:
			_ = proc.Signal(syscall.SIGTERM)
			<-exited
			return
		case err := <-exited:
			if time.Since(began) > stableAfter {
				backoff = minBackoff
			}
			log.WithError(err).WithField("restart-in", backoff).Warnf("containerd exited; see %s", s.logPath)
		}
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxBackoff)
			out, err := s.openLog()
			if err == nil {
				proc, err = s.spawn(out)
			}
			if err == nil {
				break
			}
			log.WithError(err).Error("restart containerd")
		}
		s.mu.Lock()
		s.proc = proc
		s.mu.Unlock()
		log.WithField("pid", proc.Pid).Info("containerd restarted")
	}
}

// Stop terminates containerd and waits for it until ctx ends, then kills
// it. Running containers and their shims are left alone. It is safe to
// call more than once.
func (s *Supervisor) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	_ = s.proc.Kill()
	s.mu.Unlock()
	<-s.done
	return errors.New("containerd did not stop in time and was killed")
}
