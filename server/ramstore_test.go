package server_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// ramLeases are the leases TestRAMStore follows: the node's, and those of
// the controller-manager's and the scheduler's leader election, which the
// test turns on (kelp leaves it off on SQLite, where nothing competes).
var ramLeases = []types.NamespacedName{
	{Namespace: "kube-node-lease", Name: testcluster.NodeName},
	{Namespace: "kube-system", Name: "kube-controller-manager"},
	{Namespace: "kube-system", Name: "kube-scheduler"},
}

// TestRAMStore runs a server with its node on SQLite and checks that
// Leases and Events live in the RAM store under /run/kelp, never in
// state.db, and are served; that a restart keeps them; and that a
// reboot-like restart, with the RAM store's files gone, leaves a healthy
// cluster: every lease made again and renewed, the node Ready, events
// listed and recorded again.
func TestRAMStore(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.Agent = true
	// The apiserver compacts every 20 s instead of 5 min, so that the test
	// sees compactions of a RAM store made after a reboot; --debug shows
	// kine's account of them.
	args := []string{"--debug", "--kube-apiserver-arg", "etcd-compaction-interval=20s",
		"--kube-controller-manager-arg", "leader-elect=true", "--kube-scheduler-arg", "leader-elect=true"}
	start := func() kubernetes.Interface {
		t.Helper()
		n.Start(args...)
		n.WaitReady(startTimeout)
		n.WaitLog("kelp node is running", startTimeout)
		c := n.Client()
		waitNodeReady(t, c)
		return c
	}
	ram := layout.RAMStore(n.DataDir)
	c := start()
	if out, err := n.Run(time.Minute, n.Command("test", "-s", filepath.Join(ram, "state.db"))); err != nil {
		t.Fatalf("no RAM store at %s: %v %s", ram, err, out)
	}
	first := waitLeases(t, c, time.Time{})
	firstEvents := waitEvents(t, c)
	notDurable(t, n)

	// A restart keeps the RAM store: the same leases, and the events.
	n.Stop()
	c = start()
	again := waitLeases(t, c, time.Time{})
	for _, l := range ramLeases {
		if again[l].UID != first[l].UID {
			t.Errorf("lease %s was made again after a restart: the RAM store was not kept", l)
		}
	}
	kept := eventUIDs(t, c)
	for uid := range firstEvents {
		if !kept[uid] {
			t.Errorf("event %s lost in a restart", uid)
		}
	}

	// A reboot: kelp stopped, /run emptied.
	n.Stop()
	if out, err := n.Run(time.Minute, n.Command("rm", "-r", ram)); err != nil {
		t.Fatalf("remove the RAM store: %v %s", err, out)
	}
	rebooted := time.Now()
	c = start()
	renewed := waitLeases(t, c, rebooted)
	for _, l := range ramLeases {
		if renewed[l].UID == first[l].UID {
			t.Errorf("lease %s outlived the RAM store", l)
		}
		before, _ := strconv.ParseUint(again[l].ResourceVersion, 10, 64)
		after, _ := strconv.ParseUint(renewed[l].ResourceVersion, 10, 64)
		if after <= before {
			t.Errorf("lease %s has resourceVersion %d after the reboot, %d before: the RAM store's revisions went back", l, after, before)
		}
	}
	if out, err := n.Kubectl("get", "events", "--all-namespaces"); err != nil {
		t.Errorf("kubectl get events after a reboot: %v\n%s", err, out)
	}
	for uid := range waitEvents(t, c) {
		if firstEvents[uid] {
			t.Errorf("event %s outlived the RAM store", uid)
		}
	}
	waitNodeReady(t, c)
	notDurable(t, n)
	compactsWhatItHolds(t, n, c)
	n.Stop()
}

// ramRevisions are the revisions of a RAM store: they start at the time in
// microseconds (above 1e15 since 2001), a disk store's at 1.
const ramRevisions = 1e15

var compactedRE = regexp.MustCompile(`COMPACT compacted from (\d+) to (\d+) in (\d+) transactions`)

// compactsWhatItHolds makes more than the 1000 revisions the apiserver
// leaves uncompacted in the RAM store (Events) and waits until the
// apiserver's compaction of it is done, in a handful of transactions. A
// new RAM store once recorded 0 as its compact revision: compacting it
// then took a transaction per 1000 revisions from 0 to the time in
// microseconds, a core busy for ever, and never finished.
func compactsWhatItHolds(t *testing.T, n *testcluster.Node, c kubernetes.Interface) {
	t.Helper()
	for i := range 1200 {
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: "churn-"},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: testcluster.NodeName},
			Reason:         "Churn",
			Message:        fmt.Sprintf("event %d", i),
		}
		if _, err := c.CoreV1().Events("default").Create(context.Background(), ev, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create event %d: %v", i, err)
		}
	}
	testcluster.EventuallyWithin(t, 3*time.Minute, "a compaction of the RAM store finished (9 compaction intervals)", func() (bool, error) {
		for _, m := range compactedRE.FindAllStringSubmatch(n.Log(), -1) {
			from, _ := strconv.ParseInt(m[1], 10, 64)
			if from < ramRevisions {
				continue
			}
			if txns, _ := strconv.Atoi(m[3]); txns > 3 {
				t.Errorf("the RAM store compacted from %s to %s in %d transactions, want at most 3", m[1], m[2], txns)
			}
			return true, nil
		}
		return false, nil
	})
}

// waitLeases waits until every one of ramLeases is held and was renewed
// after since, and returns them.
func waitLeases(t *testing.T, c kubernetes.Interface, since time.Time) map[types.NamespacedName]coordinationv1.Lease {
	t.Helper()
	got := map[types.NamespacedName]coordinationv1.Lease{}
	for _, l := range ramLeases {
		testcluster.Eventually(t, fmt.Sprintf("lease %s held and renewed after %s", l, since.Format(time.TimeOnly)), func() (bool, error) {
			lease, err := c.CoordinationV1().Leases(l.Namespace).Get(context.Background(), l.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" || lease.Spec.RenewTime == nil || !lease.Spec.RenewTime.After(since) {
				return false, nil
			}
			got[l] = *lease
			return true, nil
		})
	}
	return got
}

// waitEvents waits until the cluster holds events, and returns their UIDs.
func waitEvents(t *testing.T, c kubernetes.Interface) map[types.UID]bool {
	t.Helper()
	var uids map[types.UID]bool
	testcluster.Eventually(t, "events recorded", func() (bool, error) {
		uids = eventUIDs(t, c)
		return len(uids) > 0, nil
	})
	return uids
}

func eventUIDs(t *testing.T, c kubernetes.Interface) map[types.UID]bool {
	t.Helper()
	events, err := c.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list events: %v", err)
	}
	uids := map[types.UID]bool{}
	for _, e := range events.Items {
		uids[e.UID] = true
	}
	return uids
}

// notDurable reads state.db itself, while kelp runs, and fails if it holds
// any row of a Lease or an Event: none may ever have been written there.
// Nodes must be there, or the read proves nothing.
func notDurable(t *testing.T, n *testcluster.Node) {
	t.Helper()
	path := datastore.SQLitePath(n.DataDir)
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: path, RawQuery: "mode=ro"}).String())
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer db.Close()
	for prefix, want := range map[string]func(int) bool{
		"/registry/leases/":  func(rows int) bool { return rows == 0 },
		"/registry/events/":  func(rows int) bool { return rows == 0 },
		"/registry/minions/": func(rows int) bool { return rows > 0 },
	} {
		var rows int
		if err := db.QueryRow(`SELECT COUNT(*) FROM kine WHERE name >= ? AND name < ?`, prefix, prefix+"\xff").Scan(&rows); err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		if !want(rows) {
			t.Errorf("state.db holds %d rows under %s", rows, prefix)
		}
	}
}
