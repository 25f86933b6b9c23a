package datastore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// A server gets a place while no other is a learner: etcd refuses a second
// learner only when it applies the addition, and a member that replays
// the refused addition after a restart dials its id for as long as it runs.
func TestPlaceFor(t *testing.T) {
	voter := &pb.Member{ID: 1, Name: "node-1", PeerURLs: []string{"https://10.0.0.1:2380"}}
	unstarted := &pb.Member{ID: 2, PeerURLs: []string{"https://10.0.0.2:2380"}, IsLearner: true}
	learner := &pb.Member{ID: 3, Name: "node-3", PeerURLs: []string{"https://10.0.0.3:2380"}, IsLearner: true}
	for _, tc := range []struct {
		what    string
		members []*pb.Member
		name    string
		peer    string
		wantID  uint64
		wantErr error
	}{
		{"a new server beside voters", []*pb.Member{voter}, "node-4", "https://10.0.0.4:2380", 0, nil},
		{"the unstarted server itself", []*pb.Member{voter, unstarted}, "node-2", "https://10.0.0.2:2380", 2, nil},
		{"another server while one is unstarted", []*pb.Member{voter, unstarted}, "node-4", "https://10.0.0.4:2380", 0, ErrJoinInProgress},
		{"another server while one is a started learner", []*pb.Member{voter, learner}, "node-4", "https://10.0.0.4:2380", 0, ErrJoinInProgress},
		{"a voter's name", []*pb.Member{voter, learner}, "node-1", "https://10.0.0.4:2380", 0, ErrMemberTaken},
		{"a learner's peer address", []*pb.Member{voter, learner}, "node-4", "https://10.0.0.3:2380", 0, ErrMemberTaken},
	} {
		id, err := placeFor(tc.members, tc.name, tc.peer)
		if id != tc.wantID || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
			t.Errorf("%s: placeFor = %d, %v; want %d, %v", tc.what, id, err, tc.wantID, tc.wantErr)
		}
	}
}

// Servers that ask to join at once get one place: the others wait, and
// etcd never sees a second learner it would refuse only when it applies it.
func TestAddLearnerOneAtATime(t *testing.T) {
	tls := etcdTestTLS(t)
	first := startReady(t, etcdTestConfig(t, t.TempDir(), tls))
	members := first.Members()
	errs := make(chan error, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range cap(errs) {
		go func() {
			_, err := members.AddLearner(ctx, fmt.Sprintf("node-%d", i+2), fmt.Sprintf("https://127.0.0.%d:2380", i+2))
			errs <- err
		}()
	}
	added := 0
	for range cap(errs) {
		switch err := <-errs; {
		case err == nil:
			added++
		case !errors.Is(err, ErrJoinInProgress):
			t.Errorf("a server joining beside another: %v, want ErrJoinInProgress", err)
		}
	}
	if added != 1 {
		t.Errorf("%d servers added at once, want 1", added)
	}
}

// A witness has no Node: deleting a Node of the same name removes no
// witness, and Remove refuses a witness's member name, which no Node has.
func TestRemoveKeepsWitness(t *testing.T) {
	tls := etcdTestTLS(t)
	first := startReady(t, etcdTestConfig(t, t.TempDir(), tls))
	members := first.Members()
	ctx := context.Background()
	witness := WitnessMember("node-2")
	if !IsWitnessMember(witness) || IsWitnessMember("node-2") {
		t.Fatalf("IsWitnessMember(%q) or IsWitnessMember(node-2) is wrong", witness)
	}
	if _, err := members.AddLearner(ctx, witness, "https://127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"node-2", witness} {
		if removed, err := members.Remove(ctx, name); err != nil || removed {
			t.Errorf("Remove(%s) = %v, %v; want false, nil", name, removed, err)
		}
	}
	cli, err := newClient(first.Backend())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	list, err := cli.MemberList(ctx)
	if err != nil || len(list.Members) != 2 {
		t.Fatalf("members after the removals: %v, %v; want the witness kept", list, err)
	}
}

// A witness serves its client port on 127.0.0.1 alone.
func TestWitnessClientURLs(t *testing.T) {
	urls := func(us []url.URL) string {
		var out []string
		for _, u := range us {
			out = append(out, u.String())
		}
		return strings.Join(out, ",")
	}
	cfg := Config{Name: WitnessMember("pi"), AdvertiseIP: "10.0.0.9", Witness: true}
	var closing, removed atomic.Bool
	ec, err := etcdConfig(cfg, t.TempDir(), logrus.NewEntry(logrus.New()), &closing, &removed)
	if err != nil {
		t.Fatal(err)
	}
	if urls(ec.ListenClientUrls) != "https://127.0.0.1:2379" || urls(ec.AdvertiseClientUrls) != "https://127.0.0.1:2379" || urls(ec.AdvertisePeerUrls) != "https://10.0.0.9:2380" {
		t.Errorf("client %s advertised %s, peer %s", urls(ec.ListenClientUrls), urls(ec.AdvertiseClientUrls), urls(ec.AdvertisePeerUrls))
	}
	cfg.Witness = false
	if ec, _ = etcdConfig(cfg, t.TempDir(), logrus.NewEntry(logrus.New()), &closing, &removed); urls(ec.ListenClientUrls) != "https://127.0.0.1:2379,https://10.0.0.9:2379" || urls(ec.AdvertiseClientUrls) != "https://10.0.0.9:2379" {
		t.Errorf("a server's client URLs: %s advertised %s", urls(ec.ListenClientUrls), urls(ec.AdvertiseClientUrls))
	}
}

// A member started at another address than it had has its peer URL
// changed to it: etcd keeps the one the member was added with.
func TestPeerURLFollowsAddress(t *testing.T) {
	cfg := etcdTestConfig(t, t.TempDir(), etcdTestTLS(t))
	stopWithin(t, startReady(t, cfg), 30*time.Second)
	cfg.AdvertiseIP = "127.0.0.2"
	d := startReady(t, cfg)
	want := fmt.Sprintf("https://127.0.0.2:%d", cfg.peerPort)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var have []string
		withClient(t, d.Backend(), func(ctx context.Context, cli *clientv3.Client) {
			list, err := cli.MemberList(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range list.Members {
				have = append(have, m.PeerURLs...)
			}
		})
		if len(have) == 1 && have[0] == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("peer URLs %v, want %s", have, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
