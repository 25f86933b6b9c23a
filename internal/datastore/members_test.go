package datastore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A second member joins as a learner, is promoted once it has caught up,
// serves the data; a name or peer address already a member's is refused;
// and a removed member stops with an error that says it was removed.
func TestEtcdMembers(t *testing.T) {
	tls := etcdTestTLS(t)
	first := startReady(t, etcdTestConfig(t, t.TempDir(), tls))
	put(t, first.Backend(), "/registry/test/a", "one")
	members := first.Members()
	if members == nil {
		t.Fatal("no Members on embedded etcd")
	}

	second := etcdTestConfig(t, t.TempDir(), tls)
	second.Name = "node-2"
	peer := fmt.Sprintf("https://127.0.0.1:%d", second.peerPort)
	ctx := context.Background()
	initial, err := members.AddLearner(ctx, "node-2", peer)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(initial, "node-1=https://127.0.0.1:") || !strings.Contains(initial, "node-2="+peer) {
		t.Errorf("initial cluster %q", initial)
	}
	// The same server asking again before it started gets the same place.
	if again, err := members.AddLearner(ctx, "node-2", peer); err != nil || again != initial {
		t.Errorf("AddLearner again = %q, %v; want %q", again, err, initial)
	}
	// A second learner waits for the first.
	if _, err := members.AddLearner(ctx, "node-3", "https://127.0.0.1:1"); !errors.Is(err, ErrJoinInProgress) {
		t.Errorf("a second learner while one is unstarted: %v, want ErrJoinInProgress", err)
	}
	second.InitialCluster = initial
	joined := startReady(t, second)
	if got := get(t, joined.Backend(), "/registry/test/a"); got != "one" {
		t.Errorf("the joined member reads %q, want %q", got, "one")
	}
	for _, name := range []string{"node-1", "node-2"} {
		if _, err := members.AddLearner(ctx, name, "https://127.0.0.1:1"); !errors.Is(err, ErrMemberTaken) {
			t.Errorf("AddLearner(%s): %v, want ErrMemberTaken", name, err)
		}
	}

	if removed, err := members.Remove(ctx, "node-2"); err != nil || !removed {
		t.Fatalf("Remove = %v, %v", removed, err)
	}
	if removed, err := members.Remove(ctx, "node-2"); err != nil || removed {
		t.Errorf("Remove of a removed member = %v, %v; want false, nil", removed, err)
	}
	select {
	case err := <-joined.Err():
		if !strings.Contains(err.Error(), "removed from the etcd cluster") {
			t.Errorf("the removed member's error: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("the removed member did not stop")
	}
	stopWithin(t, joined, 30*time.Second)
	put(t, first.Backend(), "/registry/test/b", "two")
}
