package component

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
)

// fake is a piece whose readiness, failure and stop the test controls.
type fake struct {
	name    string
	ready   chan struct{}
	errc    chan error
	stopped func(name string)
	stop    func(ctx context.Context) error
}

func newFake(name string, log func(string)) *fake {
	return &fake{name: name, ready: make(chan struct{}), errc: make(chan error, 1), stopped: log}
}

func (f *fake) Name() string           { return f.name }
func (f *fake) Ready() <-chan struct{} { return f.ready }
func (f *fake) Err() <-chan error      { return f.errc }
func (f *fake) NotReady() error        { return errors.New("still dialling") }
func (f *fake) Stop(ctx context.Context) error {
	f.stopped(f.name)
	if f.stop != nil {
		return f.stop(ctx)
	}
	return nil
}

type order struct {
	mu    sync.Mutex
	names []string
}

func (o *order) add(n string) { o.mu.Lock(); o.names = append(o.names, n); o.mu.Unlock() }

func TestGroupStartsInOrderAndStopsInReverse(t *testing.T) {
	var o order
	g := NewGroup(context.Background(), time.Minute)
	for _, name := range []string{"datastore", "apiserver", "kubelet"} {
		f := newFake(name, o.add)
		close(f.ready)
		if err := g.Start(f, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.names, ","); got != "kubelet,apiserver,datastore" {
		t.Errorf("stopped %s", got)
	}
}

// The wait for one piece's readiness ends as soon as a piece started
// before it fails, with that piece's error, not after the ready timeout.
func TestGroupWatchesEarlierPiecesWhileWaiting(t *testing.T) {
	var o order
	g := NewGroup(context.Background(), time.Hour)
	store := newFake("datastore", o.add)
	close(store.ready)
	if err := g.Start(store, nil); err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(50 * time.Millisecond); store.errc <- errors.New("database is locked") }()
	began := time.Now()
	err := g.Start(newFake("kube-controller-manager", o.add), nil)
	if err == nil || err.Error() != "datastore: database is locked" {
		t.Fatalf("got %v", err)
	}
	if time.Since(began) > 10*time.Second {
		t.Error("the failure was seen only late")
	}
	_ = g.Stop(context.Background())
	if got := strings.Join(o.names, ","); got != "kube-controller-manager,datastore" {
		t.Errorf("a piece that never became ready must still be stopped: %s", got)
	}
}

func TestGroupReadyTimeoutSaysWhy(t *testing.T) {
	g := NewGroup(context.Background(), 50*time.Millisecond)
	err := g.Start(newFake("kubelet", func(string) {}), nil)
	if err == nil || !strings.Contains(err.Error(), "kubelet not ready after 50ms (last: still dialling)") {
		t.Errorf("got %v", err)
	}
}

// TestGroupSaysWhileItWaits: a slow piece is waited for, and the wait
// says every interval what it waits for and why, until the piece is ready.
func TestGroupSaysWhileItWaits(t *testing.T) {
	logs := logtest.NewGlobal()
	defer logs.Reset()
	g := NewGroup(context.Background(), time.Minute, Progress(20*time.Millisecond))
	f := newFake("apiserver", func(string) {})
	go func() {
		time.Sleep(200 * time.Millisecond)
		close(f.ready)
	}()
	if err := g.Start(f, nil); err != nil {
		t.Fatalf("a piece ready after 200 ms: %v", err)
	}
	said := 0
	for _, e := range logs.AllEntries() {
		if e.Message == "waiting for apiserver to be ready (last: still dialling); kelp gives up after 1m0s" {
			said++
		}
	}
	if said < 2 {
		t.Errorf("said %d times that it waits, want one line every 20 ms of the 200", said)
	}
}

func TestGroupStopAskedDuringStartUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	g := NewGroup(ctx, time.Hour)
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if err := g.Start(newFake("apiserver", func(string) {}), nil); !errors.Is(err, ErrStopped) {
		t.Errorf("got %v", err)
	}
	if err := g.Wait(); err != nil {
		t.Errorf("Wait after the context ended: %v", err)
	}
}

func TestGroupConstructorError(t *testing.T) {
	g := NewGroup(context.Background(), time.Minute)
	want := errors.New("kube-apiserver flags: unknown flag --nope")
	if err := g.Start((*fake)(nil), want); err != want {
		t.Errorf("got %v", err)
	}
	if err := g.Stop(context.Background()); err != nil {
		t.Errorf("nothing was started, nothing to stop: %v", err)
	}
}

func TestGroupWaitFansInFailures(t *testing.T) {
	g := NewGroup(context.Background(), time.Minute)
	var pieces []*fake
	for _, name := range []string{"a", "b", "c"} {
		f := newFake(name, func(string) {})
		close(f.ready)
		pieces = append(pieces, f)
		if err := g.Start(f, nil); err != nil {
			t.Fatal(err)
		}
	}
	pieces[1].errc <- errors.New("crashed")
	if err := g.Wait(); err == nil || err.Error() != "b: crashed" {
		t.Errorf("got %v", err)
	}
	pieces[2].errc <- errors.New("also crashed") // nobody listens: Stop must not hang
	if err := g.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestGroupStopIsBoundedAndKeepsTheReserve(t *testing.T) {
	g := NewGroup(context.Background(), time.Minute, StopReserve(time.Second))
	var storeHad time.Duration
	store := newFake("datastore", func(string) {})
	store.stop = func(ctx context.Context) error {
		d, _ := ctx.Deadline()
		storeHad = time.Until(d)
		return nil
	}
	stuck := newFake("stuck", func(string) {})
	stuck.stop = func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	for _, f := range []*fake{store, stuck} {
		close(f.ready)
		if err := g.Start(f, nil); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	err := g.Stop(ctx)
	if err == nil || !strings.Contains(err.Error(), "stop stuck:") {
		t.Errorf("got %v", err)
	}
	if storeHad < 500*time.Millisecond { // without the reserve: nothing
		t.Errorf("the first piece had %s left to stop, want about its 1s reserve", storeHad)
	}
}

func TestRunStopsWhatStartedWhenStartFails(t *testing.T) {
	var o order
	err := Run(context.Background(), "kelp test", logrus.NewEntry(logrus.New()), func(_ context.Context, g *Group) error {
		f := newFake("datastore", o.add)
		close(f.ready)
		if err := g.Start(f, nil); err != nil {
			return err
		}
		return errors.New("write kubeconfig: read-only file system")
	})
	if err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("got %v", err)
	}
	if strings.Join(o.names, ",") != "datastore" {
		t.Errorf("stopped %v", o.names)
	}
}

func TestRunStopDuringStartIsNotAFailure(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	err := Run(ctx, "kelp test", logrus.NewEntry(logrus.New()), func(_ context.Context, g *Group) error {
		cancel()
		return g.Start(newFake("apiserver", func(string) {}), nil)
	})
	if err != nil {
		t.Errorf("got %v", err)
	}
}

// notifySocket listens where a service manager would; read returns the
// next message kelp sent within wait, or "" if none came.
func notifySocket(t *testing.T) (read func(wait time.Duration) string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return func(wait time.Duration) string {
		buf := make([]byte, 512)
		_ = conn.SetReadDeadline(time.Now().Add(wait))
		n, err := conn.Read(buf)
		if err != nil {
			return ""
		}
		return string(buf[:n])
	}
}

// A service manager hears READY=1 once everything started, and
// STOPPING=1 when kelp stops; a start that fails is never reported ready.
func TestRunNotifiesTheServiceManager(t *testing.T) {
	read := notifySocket(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, "kelp test", logrus.NewEntry(logrus.New()), func(_ context.Context, g *Group) error {
			f := newFake("datastore", func(string) {})
			close(f.ready)
			return g.Start(f, nil)
		})
	}()
	if got := read(10 * time.Second); got != "READY=1" {
		t.Errorf("after start: sent %q, want READY=1", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := read(10 * time.Second); got != "STOPPING=1" {
		t.Errorf("after stop: sent %q, want STOPPING=1", got)
	}

	_ = Run(context.Background(), "kelp test", logrus.NewEntry(logrus.New()), func(context.Context, *Group) error {
		return errors.New("port 6443 in use")
	})
	if got := read(200 * time.Millisecond); got != "" {
		t.Errorf("a failed start sent %q", got)
	}
}

// The in-process kube-apiserver says READY=1 itself once it serves
// (k8s.io/apiserver's genericapiserver), minutes before the control plane
// and the node run on a slow machine, and unsets NOTIFY_SOCKET after.
// The socket is kelp's: systemd must hear READY=1 from Run alone.
func TestRunKeepsTheNotifySocketFromWhatItStarts(t *testing.T) {
	read := notifySocket(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	early := make(chan string, 1)
	go func() {
		done <- Run(ctx, "kelp test", logrus.NewEntry(logrus.New()), func(_ context.Context, g *Group) error {
			_, _ = daemon.SdNotify(true, daemon.SdNotifyReady)
			early <- read(500 * time.Millisecond)
			f := newFake("apiserver", func(string) {})
			close(f.ready)
			return g.Start(f, nil)
		})
	}()
	if got := <-early; got != "" {
		t.Errorf("a piece told the service manager %q before kelp was ready", got)
	}
	if got := read(10 * time.Second); got != "READY=1" {
		t.Errorf("after start: sent %q, want READY=1", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := read(10 * time.Second); got != "STOPPING=1" {
		t.Errorf("after stop: sent %q, want STOPPING=1", got)
	}
}
