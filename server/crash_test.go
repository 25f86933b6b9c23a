package server_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	// The pure-Go SQLite driver kine uses in kelp, to check state.db.
	_ "modernc.org/sqlite"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

const (
	// crashKills is how many times each datastore is killed, unless
	// KELP_CRASH_KILLS says otherwise (scripts/soak.sh crash).
	crashKills = 10
	// crashObjects ConfigMaps are written by crashWriters clients at once,
	// each client updating its own share of them over and over.
	crashObjects = 50
	crashWriters = 5
	// crashMaxWriting is the longest the writers run before a kill; each
	// round picks a random time up to it.
	crashMaxWriting = 3 * time.Second
	crashNS         = "default"
	crashLabel      = "kelp.test/crash"
)

// TestCrash kills kelp with SIGKILL at random moments while clients write,
// restarts it on the same data dir, and checks that every write the
// apiserver acknowledged is still there and that the datastore's files are
// intact. A write that failed or was cut off by the kill may or may not have
// happened; an acknowledged one must never be lost.
func TestCrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		// intact checks the datastore's files while kelp is stopped.
		intact func(dataDir string) error
		// history, if set, compares the datastore's own account of its
		// history before a kill and after the restart.
		history history
	}{
		{"SQLite", nil, sqliteIntact, nil},
		{"EmbeddedEtcd", []string{"--cluster-init"}, etcdIntact, &etcdHistory{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := testcluster.NewNode(t)
			crashRepeatedly(t, n, tc.args, tc.intact, tc.history)
		})
	}
}

// history is a datastore's own account of what it holds, recorded just
// before a kill and compared after the restart.
type history interface {
	record(t *testing.T, n *testcluster.Node)
	// compare says what it compared, or why it could not.
	compare(t *testing.T, n *testcluster.Node) string
}

// crashRepeatedly runs the rounds of TestCrash on n: write, kill, check the
// files, restart, read everything back. hist may be nil.
func crashRepeatedly(t *testing.T, n *testcluster.Node, args []string, intact func(string) error, hist history) {
	kills := crashKills
	if testing.Short() {
		kills = 3
	}
	if v := os.Getenv("KELP_CRASH_KILLS"); v != "" {
		var err error
		if kills, err = strconv.Atoi(v); err != nil || kills < 1 {
			t.Fatalf("KELP_CRASH_KILLS=%q: want a number of kills, at least 1", v)
		}
	}
	began := time.Now()
	n.Start(args...)
	n.WaitReady(startTimeout)
	l := newLedger(crashObjects)
	var restarts []time.Duration
	acked, checked, cutOffCommitted := 0, 0, 0
	for round := 1; round <= kills; round++ {
		writing := rand.N(crashMaxWriting)
		kill := n.Kill
		if hist != nil {
			kill = func() {
				hist.record(t, n)
				n.Kill()
			}
		}
		w := l.writeUntilKilled(t, crashClient(t, n), writing, kill)
		acked += w.acked
		if left := n.Processes(); len(left) > 0 {
			t.Errorf("round %d: processes outlived kelp, a server without an agent starts none: %v", round, left)
		}
		if err := intact(n.DataDir); err != nil {
			t.Fatalf("round %d: after SIGKILL: %v", round, err)
		}

		start := time.Now()
		n.Start(args...)
		n.WaitReady(startTimeout)
		restarts = append(restarts, time.Since(start))
		c, committed := l.check(t, crashClient(t, n))
		checked += c
		cutOffCommitted += committed
		t.Logf("round %d: killed after %s of writing: %d writes acknowledged, %d cut off; restarted in %s; %d acknowledged objects checked, %d hold a cut-off write",
			round, writing.Round(time.Millisecond), w.acked, w.cutOff, restarts[len(restarts)-1].Round(time.Millisecond), c, committed)
		if hist != nil {
			t.Logf("round %d: %s", round, hist.compare(t, n))
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	n.Stop()
	if err := intact(n.DataDir); err != nil {
		t.Fatalf("after the last clean stop: %v", err)
	}
	slices.Sort(restarts)
	t.Logf("%s: %d kills, %d writes acknowledged, 0 of them lost, %d acknowledged objects checked after restarts, %d cut-off writes found committed, datastore intact after every kill; restart to ready min %s median %s max %s; total %s",
		t.Name(), kills, acked, checked, cutOffCommitted, restarts[0].Round(time.Millisecond), restarts[len(restarts)/2].Round(time.Millisecond),
		restarts[len(restarts)-1].Round(time.Millisecond), time.Since(began).Round(time.Second))
}

// crashClient is a client of n's apiserver without client-side rate
// limiting, which would otherwise cap the writers at a few writes a second.
func crashClient(t *testing.T, n *testcluster.Node) kubernetes.Interface {
	t.Helper()
	cfg := n.RestConfig()
	cfg.QPS, cfg.Burst = -1, 0
	cfg.Timeout = 30 * time.Second
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ledger is what the writers know about each ConfigMap crash-NN.
type ledger struct {
	objects []object
}

type object struct {
	// exists says the object must be there: its creation was acknowledged,
	// or it was read back after a restart; value is then its last
	// acknowledged or read value.
	exists bool
	value  int
	// unsure are the values sent since, in writes that failed or were cut
	// off by the kill: any of them may have been committed.
	unsure []int
	// sent is the last value sent; every write sends a new, higher one.
	sent int
}

func newLedger(n int) *ledger {
	return &ledger{objects: make([]object, n)}
}

func crashName(i int) string { return fmt.Sprintf("crash-%02d", i) }

// roundWrites counts the writes of one round.
type roundWrites struct {
	acked  int // acknowledged by the apiserver
	cutOff int // failed, or in flight at the kill
}

// writeUntilKilled runs the writers for d, then calls kill under them and
// waits until every writer has stopped at its first failed write. A write
// that fails before the kill is reported: it means a round wrote less than
// it seemed to, though the check stays valid.
func (l *ledger) writeUntilKilled(t *testing.T, c kubernetes.Interface, d time.Duration, kill func()) roundWrites {
	t.Helper()
	var (
		wg      sync.WaitGroup
		killed  atomic.Bool
		results = make([]roundWrites, crashWriters)
		early   = make([]error, crashWriters)
	)
	for w := range crashWriters {
		wg.Go(func() {
			for {
				// Writer w owns objects w, w+crashWriters, …: no two writers
				// touch the same object, so the ledger needs no lock.
				for i := w; i < len(l.objects); i += crashWriters {
					if err := l.write(c, i); err != nil {
						results[w].cutOff++
						if !killed.Load() {
							early[w] = err
						}
						return
					}
					results[w].acked++
				}
			}
		})
	}
	time.Sleep(d) // the random moment of the crash
	killed.Store(true)
	kill()
	wg.Wait()

	var total roundWrites
	for w, r := range results {
		total.acked += r.acked
		total.cutOff += r.cutOff
		if early[w] != nil {
			t.Logf("writer %d failed before the kill: %v", w, early[w])
		}
	}
	return total
}

// write sends the next value of object i: a create if the object is not
// known to exist, else a patch, which needs no resourceVersion.
func (l *ledger) write(c kubernetes.Interface, i int) error {
	o := &l.objects[i]
	o.sent++
	v := o.sent
	ctx := context.Background()
	var err error
	if o.exists {
		patch := fmt.Sprintf(`{"data":{"v":"%d"}}`, v)
		_, err = c.CoreV1().ConfigMaps(crashNS).Patch(ctx, crashName(i), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	} else {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: crashName(i), Labels: map[string]string{crashLabel: "true"}},
			Data:       map[string]string{"v": strconv.Itoa(v)},
		}
		_, err = c.CoreV1().ConfigMaps(crashNS).Create(ctx, cm, metav1.CreateOptions{})
	}
	if err != nil {
		o.unsure = append(o.unsure, v)
		return fmt.Errorf("write %s=%d: %w", crashName(i), v, err)
	}
	o.exists, o.value, o.unsure = true, v, nil
	return nil
}

// check reads every object back from a restarted server and compares it
// with the ledger. It returns how many acknowledged objects it checked, and
// how many objects hold the value of a write that was cut off by the kill:
// those show the kills land in the middle of writes. What it reads is
// committed, so it becomes the ledger's new starting point.
func (l *ledger) check(t *testing.T, c kubernetes.Interface) (checked, cutOffCommitted int) {
	t.Helper()
	list, err := c.CoreV1().ConfigMaps(crashNS).List(context.Background(), metav1.ListOptions{LabelSelector: crashLabel})
	if err != nil {
		t.Fatalf("list ConfigMaps after restart: %v", err)
	}
	found := make(map[string]int, len(list.Items))
	for _, cm := range list.Items {
		v, err := strconv.Atoi(cm.Data["v"])
		if err != nil {
			t.Errorf("%s holds %q, not a value the writers sent", cm.Name, cm.Data["v"])
		}
		found[cm.Name] = v
	}
	for i := range l.objects {
		o, name := &l.objects[i], crashName(i)
		v, ok := found[name]
		delete(found, name)
		switch {
		case o.exists && !ok:
			t.Errorf("%s is gone: its value %d was acknowledged", name, o.value)
		case ok && !(o.exists && v == o.value) && !slices.Contains(o.unsure, v):
			t.Errorf("%s = %d, want %s", name, v, allowed(o))
		}
		if o.exists {
			checked++
		}
		if ok && slices.Contains(o.unsure, v) {
			cutOffCommitted++
		}
		o.exists, o.value, o.unsure = ok, v, nil
	}
	for name := range found {
		t.Errorf("%s exists but was never written", name)
	}
	return checked, cutOffCommitted
}

// allowed says which values o may hold after a crash.
func allowed(o *object) string {
	var want []string
	if o.exists {
		want = append(want, fmt.Sprintf("the acknowledged %d", o.value))
	}
	if len(o.unsure) > 0 {
		want = append(want, fmt.Sprintf("one of %v, sent since and not acknowledged", o.unsure))
	}
	if len(want) == 0 {
		return "no object: none was acknowledged or sent"
	}
	return strings.Join(want, " or ")
}

// sqliteIntact runs SQLite's full integrity check on state.db. kill -9
// leaves a WAL beside it; a read-only connection reads the WAL too, but
// neither checkpoints nor removes it, so kelp restarts on the files exactly
// as the kill left them.
func sqliteIntact(dataDir string) error {
	path := filepath.Join(layout.Server(dataDir).DB, "state.db")
	dsn := (&url.URL{Scheme: "file", Path: path, RawQuery: "mode=ro"}).String()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	rows, err := db.Query("PRAGMA integrity_check")
	if err != nil {
		return fmt.Errorf("integrity check of %s: %w", path, err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return fmt.Errorf("integrity check of %s: %w", path, err)
		}
		problems = append(problems, line)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("integrity check of %s: %w", path, err)
	}
	if len(problems) != 1 || problems[0] != "ok" {
		return fmt.Errorf("%s is corrupt: %s", path, strings.Join(problems, "; "))
	}
	return nil
}

// etcdIntact runs bbolt's consistency check, the one of `bbolt check`, on
// the embedded etcd member's backend: every page reachable exactly once,
// free pages not in use. The WAL needs no check here: the restart replays
// it, and etcd refuses to start on a WAL it cannot read.
func etcdIntact(dataDir string) error {
	path := filepath.Join(layout.Server(dataDir).DB, "etcd", "member", "snap", "db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		var problems []error
		for err := range tx.Check() {
			problems = append(problems, err)
		}
		if len(problems) > 0 {
			return fmt.Errorf("%s is corrupt: %w", path, errors.Join(problems...))
		}
		return nil
	})
}

// etcdHistory checks that a crash changes nothing in the member's MVCC
// history up to the last revision it reported before the kill: HashKV
// hashes every key revision up to a revision, as etcd's own corruption
// check between members does. The hash also covers writes of the
// controller-manager and the scheduler, not only the test's.
type etcdHistory struct {
	rev, compacted int64
	hash           uint32
}

const etcdLocalEndpoint = "https://127.0.0.1:2379"

func (h *etcdHistory) record(t *testing.T, n *testcluster.Node) {
	t.Helper()
	resp, err := etcdHashKV(t, n, 0)
	if err != nil {
		t.Fatalf("etcd HashKV before the kill: %v", err)
	}
	h.rev, h.compacted, h.hash = resp.HashRevision, resp.CompactRevision, resp.Hash
}

func (h *etcdHistory) compare(t *testing.T, n *testcluster.Node) string {
	t.Helper()
	resp, err := etcdHashKV(t, n, h.rev)
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Sprintf("etcd history not compared: revision %d is compacted", h.rev)
	case err != nil:
		t.Fatalf("etcd HashKV at revision %d after the restart: %v", h.rev, err)
	case resp.CompactRevision != h.compacted:
		// The hash starts at the compacted revision, so a compaction in
		// between changes it.
		return fmt.Sprintf("etcd history not compared: compacted at %d since the kill, was %d", resp.CompactRevision, h.compacted)
	case resp.Hash != h.hash:
		t.Errorf("etcd history up to revision %d changed in the crash: HashKV %08x, %08x before the kill", h.rev, resp.Hash, h.hash)
	}
	return fmt.Sprintf("etcd history up to revision %d unchanged (HashKV %08x)", h.rev, h.hash)
}

// etcdHashKV asks n's etcd member for the hash of its keys up to rev (0:
// the current revision), as the apiserver's etcd client, from inside n.
func etcdHashKV(t *testing.T, n *testcluster.Node, rev int64) (*clientv3.HashKVResponse, error) {
	t.Helper()
	f := pki.FilesIn(layout.Server(n.DataDir).TLS)
	tlsCfg, err := (transport.TLSInfo{CertFile: f.EtcdClient.Cert, KeyFile: f.EtcdClient.Key, TrustedCAFile: f.EtcdServerCA.Cert}).ClientConfig()
	if err != nil {
		t.Fatalf("etcd client TLS files: %v", err)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{etcdLocalEndpoint},
		TLS:         tlsCfg,
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return n.DialContext(ctx, "tcp", addr)
		})},
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cli.HashKV(ctx, etcdLocalEndpoint, rev)
}
