package etcdmembers

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kelp-dev/kelp/internal/informer/informertest"
)

type removals chan string

func (r removals) Remove(_ context.Context, name string) (bool, error) {
	r <- name
	return true, nil
}

// Deleting a Node removes the etcd member of that name; nodes that exist
// when it starts are left alone.
func TestRemovesMemberOfDeletedNode(t *testing.T) {
	node := func(name string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }
	client := fake.NewClientset(node("server-1"), node("server-2"))
	watching := make(chan struct{})
	var once sync.Once
	client.PrependWatchReactor("nodes", func(action k8stesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace())
		once.Do(func() { close(watching) })
		return true, w, err
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	removed := make(removals, 4)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, informertest.Cache(t, client, nil), removed) }()

	// A deletion before the informer watches would go unseen.
	<-watching
	if err := client.CoreV1().Nodes().Delete(ctx, "server-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case name := <-removed:
		if name != "server-2" {
			t.Errorf("removed the member of %s, want server-2", name)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no member removed after the Node was deleted")
	}
	select {
	case name := <-removed:
		t.Errorf("also removed %s", name)
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
