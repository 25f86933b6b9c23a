package reconcile

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

// pass is what one Sync saw.
type pass struct {
	resync   bool
	services int // in the cache
}

// fixture is a loop over the Services and Nodes of a fake cluster whose
// Sync reports each pass on passes, and fails with fail if it is set.
type fixture struct {
	client   *fake.Clientset
	services cache.SharedIndexInformer
	loop     Loop
	passes   chan pass
	fail     chan error
}

func newFixture(objs ...runtime.Object) *fixture {
	client := fake.NewClientset(objs...)
	factory := informers.NewSharedInformerFactory(client, 0)
	services := factory.Core().V1().Services()
	f := &fixture{client: client, services: services.Informer(), passes: make(chan pass, 100), fail: make(chan error, 1)}
	f.loop = Loop{
		Informers: map[string]cache.SharedIndexInformer{"services": services.Informer(), "nodes": factory.Core().V1().Nodes().Informer()},
		Sync: func(ctx context.Context, resync bool) error {
			svcs, err := services.Lister().List(labels.Everything())
			if err != nil {
				return err
			}
			f.passes <- pass{resync: resync, services: len(svcs)}
			select {
			case err := <-f.fail:
				return err
			default:
				return nil
			}
		},
	}
	return f
}

// run runs the loop until the test ends, and returns what Run returned.
func (f *fixture) run(t *testing.T) <-chan error {
	ctx, cancel := context.WithCancel(context.Background())
	done, returned := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(returned)
		done <- f.loop.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-returned
	})
	return done
}

// next is the next pass.
func (f *fixture) next(t *testing.T) pass {
	t.Helper()
	select {
	case p := <-f.passes:
		return p
	case <-time.After(10 * time.Second):
		t.Fatal("no Sync")
		return pass{}
	}
}

// none checks that no pass comes within d.
func (f *fixture) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case p := <-f.passes:
		t.Errorf("one Sync too many: %+v", p)
	case <-time.After(d):
	}
}

func (f *fixture) create(t *testing.T, name string) {
	t.Helper()
	if _, err := f.client.CoreV1().Services("default").Create(context.Background(), service(name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func service(name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
}

// Sync runs once at start, on complete caches, and not again while nothing
// changes; Run returns nil when ctx ends, with its informers stopped.
func TestSyncOnceAtStart(t *testing.T) {
	f := newFixture(service("a"), service("b"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.loop.Run(ctx) }()
	if p := f.next(t); p != (pass{services: 2}) {
		t.Errorf("first Sync saw %+v, want the two services and no resync", p)
	}
	f.none(t, 300*time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil when ctx ends", err)
	}
	if !f.services.IsStopped() {
		t.Error("informer still running after Run returned")
	}
}

// A burst of changes within Coalesce costs one Sync, which sees them all.
func TestCoalesce(t *testing.T) {
	f := newFixture()
	f.loop.Coalesce = 300 * time.Millisecond
	f.run(t)
	f.next(t)
	for i := range 5 {
		f.create(t, fmt.Sprint("svc-", i))
	}
	if p := f.next(t); p != (pass{services: 5}) {
		t.Errorf("after a burst of changes Sync saw %+v, want all five services", p)
	}
	f.none(t, 2*f.loop.Coalesce)
}

// Without a change, Sync runs on every Resync tick, and says so.
func TestResync(t *testing.T) {
	f := newFixture(service("a"))
	f.loop.Resync = 20 * time.Millisecond
	f.run(t)
	if p := f.next(t); p.resync {
		t.Error("first Sync is a resync")
	}
	for range 2 {
		if p := f.next(t); p != (pass{resync: true, services: 1}) {
			t.Errorf("on the tick Sync saw %+v", p)
		}
	}
	f.create(t, "b")
	for {
		// A tick may come before the change does.
		if p := f.next(t); p.services == 2 {
			if p.resync {
				t.Error("Sync after a change is a resync")
			}
			break
		}
	}
}

// When a cache never syncs, Run says which one on ctx end, and why that
// may be; Sync never runs on a partial cache.
func TestNotSynced(t *testing.T) {
	f := newFixture()
	f.client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := f.loop.Run(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "caches of services not synced") ||
		!strings.Contains(err.Error(), "apiserver may be unreachable") {
		t.Errorf("Run = %v, want services (and not nodes) named, the apiserver suspected and ctx's error wrapped", err)
	}
	select {
	case p := <-f.passes:
		t.Errorf("Sync ran: %+v", p)
	default:
	}
}

// A Sync that fails ends Run with its error, informers stopped.
func TestSyncFailureEndsRun(t *testing.T) {
	f := newFixture()
	done := f.run(t)
	f.next(t)
	boom := errors.New("boom")
	f.fail <- boom
	f.create(t, "a")
	f.next(t)
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Errorf("Run = %v, want %v", err, boom)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after Sync failed")
	}
	if !f.services.IsStopped() {
		t.Error("informer still running after Run returned")
	}
}

// With Start, the informers are a shared cache's: Run starts them through
// it, and they run on, without its handler, once it returned, for the next
// loop over them.
func TestSharedInformers(t *testing.T) {
	client := fake.NewClientset(service("a"))
	factory := informers.NewSharedInformerFactory(client, 0)
	stop := make(chan struct{})
	defer factory.Shutdown()
	defer close(stop)
	services := factory.Core().V1().Services()
	loop := func(passes chan<- int) Loop {
		return Loop{
			Informers: map[string]cache.SharedIndexInformer{"services": services.Informer()},
			Start:     func() { factory.Start(stop) },
			Sync: func(context.Context, bool) error {
				svcs, err := services.Lister().List(labels.Everything())
				passes <- len(svcs)
				return err
			},
		}
	}
	for i, want := range []int{1, 2} {
		ctx, cancel := context.WithCancel(context.Background())
		passes := make(chan int, 10)
		done := make(chan error, 1)
		go func() { done <- loop(passes).Run(ctx) }()
		select {
		case n := <-passes:
			if n != want {
				t.Errorf("loop %d saw %d Services, want %d", i, n, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("loop %d: no Sync", i)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("loop %d: %v", i, err)
		}
		if services.Informer().IsStopped() {
			t.Fatal("a loop stopped the shared informer")
		}
		if i > 0 {
			break
		}
		if _, err := client.CoreV1().Services("default").Create(context.Background(), service("b"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The cache follows without the loop.
		if err := waitFor(func() bool { l, _ := services.Lister().List(labels.Everything()); return len(l) == 2 }); err != nil {
			t.Fatal("the shared cache did not follow once the loop returned")
		}
	}
}

// waitFor polls ok for up to 10 s.
func waitFor(ok func() bool) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ok() {
			return nil
		}
	}
	return errors.New("timed out")
}
