package datastore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// churner writes through the etcd API the way the apiserver does: every
// create, update and delete is a transaction on the key's revision, the
// only writes kine knows.
type churner struct {
	cli     *clientv3.Client
	revs    []int64 // each key's mod revision; 0 while it does not exist
	writers int
}

func newChurner(t *testing.T, be Backend, keys, writers int) *churner {
	t.Helper()
	cli, err := newClient(be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return &churner{cli: cli, revs: make([]int64, keys), writers: writers}
}

func churnKey(i int) string { return fmt.Sprintf("/registry/churn/key-%06d", i) }

// write puts value under every key, or deletes every key when value is
// empty, with c.writers writers at once.
func (c *churner) write(t *testing.T, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	next := make(chan int)
	errs := make(chan error, c.writers)
	var wg sync.WaitGroup
	for range c.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				key := churnKey(i)
				op := clientv3.OpDelete(key)
				if value != "" {
					op = clientv3.OpPut(key, value)
				}
				resp, err := c.cli.Txn(ctx).
					If(clientv3.Compare(clientv3.ModRevision(key), "=", c.revs[i])).
					Then(op).
					Else(clientv3.OpGet(key)).
					Commit()
				if err == nil && !resp.Succeeded {
					err = fmt.Errorf("%s changed under the test", key)
				}
				if err != nil {
					errs <- err
					return
				}
				c.revs[i] = 0
				if value != "" {
					c.revs[i] = resp.Header.Revision
				}
			}
		}()
	}
	func() {
		defer close(next)
		for i := range c.revs {
			select {
			case next <- i:
			case err := <-errs:
				t.Fatal(err)
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// compact compacts the datastore at its current revision, as the
// apiserver does every 5 minutes.
func (c *churner) compact(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := c.cli.Get(ctx, "/registry/churn/none")
	if err != nil {
		t.Fatal(err)
	}
	// kine answers with a revision it may not count as current yet: with
	// concurrent writers, its current revision can stay below the newest
	// until the next write (sqllog.Append's CompareAndSwap loses to a
	// later insert that finished first). The apiserver writes all the
	// time; the test writes a key of its own.
	for {
		_, err = c.cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
		if err == nil || !strings.Contains(err.Error(), "future revision") || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
		if _, err := c.cli.Put(ctx, "/registry/churn/tick", "x"); err != nil {
			t.Fatal(err)
		}
	}
	if err != nil {
		t.Fatalf("compact at %d: %v", resp.Header.Revision, err)
	}
}

func fileSize(t *testing.T, paths ...string) int64 {
	t.Helper()
	var n int64
	for _, p := range paths {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// churnValue is the size of a value: with its key, about 1 KiB an object.
const churnValue = 1000

func churnValueOf(round, write int) string {
	prefix := fmt.Sprintf("round %d write %d ", round, write)
	return prefix + strings.Repeat("x", churnValue-len(prefix))
}

// TestSQLiteChurnStaysBounded rewrites 2k objects of 1 KiB twice per
// round, compacting after each round as the apiserver would. SQLite never
// gives space back to the file system (kine creates the database without
// auto_vacuum), but it reuses the pages compaction frees, so the file stops
// growing once it holds the live data and one round of churn: without
// compaction every round would add 16 MiB (kine keeps the previous value in
// every row, and a 2 KiB row takes a 4 KiB page).
func TestSQLiteChurnStaysBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 14k objects")
	}
	const churnKeys = 2000
	const churnLive = churnKeys * churnValue
	dataDir := t.TempDir()
	d := startReady(t, Config{DataDir: dataDir})
	db := filepath.Join(dataDir, "server", "db", stateDBName)

	c := newChurner(t, d.Backend(), churnKeys, 4)
	began := time.Now()
	c.write(t, churnValueOf(0, 0))
	t.Logf("%d objects (%s of values) written in %s: state.db %s, WAL %s", churnKeys, mib(churnLive), time.Since(began).Round(time.Millisecond), mib(fileSize(t, db)), mib(fileSize(t, db+"-wal")))
	var sizes []int64
	for round := 1; round <= 3; round++ {
		began := time.Now()
		c.write(t, churnValueOf(round, 1))
		c.write(t, churnValueOf(round, 2))
		peak := fileSize(t, db)
		c.compact(t)
		// The next write after a checkpoint restarts the WAL, as the
		// apiserver's lease updates do all the time.
		c.cli.Put(context.Background(), "/registry/churn/tick", "x")
		sizes = append(sizes, fileSize(t, db))
		t.Logf("round %d (%s): %d updates; state.db %s before compaction, %s after (%.1f× the values); WAL %s", round, time.Since(began).Round(time.Millisecond), 2*churnKeys, mib(peak), mib(sizes[round-1]), float64(sizes[round-1])/churnLive, mib(fileSize(t, db+"-wal")))
	}
	if float64(sizes[2]) > 1.1*float64(sizes[1]) {
		t.Errorf("state.db grew from %s to %s in round 3: compaction does not free pages, or SQLite does not reuse them", mib(sizes[1]), mib(sizes[2]))
	}
	if w := fileSize(t, db+"-wal"); w > 16<<20 {
		t.Errorf("the WAL is %s after the churn: journal_size_limit should bring it back to 16 MiB at a checkpoint", mib(w))
	}
}

// TestEtcdChurnDefrag churns 10k objects in an embedded etcd member,
// then lets the defragmenter's check shrink the file back to about the
// size of the live data.
func TestEtcdChurnDefrag(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 50k objects")
	}
	const churnKeys = 10000
	const churnLive = churnKeys * churnValue
	dataDir := t.TempDir()
	d := startReady(t, etcdTestConfig(t, dataDir, etcdTestTLS(t)))
	be := d.Backend()
	file := filepath.Join(dataDir, "server", "db", etcdDirName, "member", "snap", "db")

	c := newChurner(t, be, churnKeys, 16)
	began := time.Now()
	c.write(t, churnValueOf(0, 0))
	t.Logf("%d objects (%s of values) written in %s: bbolt file %s", churnKeys, mib(churnLive), time.Since(began).Round(time.Millisecond), mib(fileSize(t, file)))
	for round := 1; round <= 2; round++ {
		c.write(t, churnValueOf(round, 1))
		c.write(t, churnValueOf(round, 2))
		peak := fileSize(t, file)
		c.compact(t)
		t.Logf("round %d: %d updates, %s before compaction, %s after", round, 2*churnKeys, mib(peak), mib(fileSize(t, file)))
	}

	df := testDefragger(t, be)
	st, err := df.status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before defragmentation: file %s, %s in use", mib(st.DbSize), mib(st.DbSizeInUse))
	if st.DbSize < 2*churnLive {
		t.Fatalf("the file is only %s after the churn: nothing for the defragmenter to do, the test proves nothing", mib(st.DbSize))
	}
	done, err := df.check(context.Background(), false)
	if err != nil || !done {
		t.Fatalf("check = %v, %v; want a defragmentation", done, err)
	}
	after := fileSize(t, file)
	t.Logf("after defragmentation: file %s (%.1f× the values)", mib(after), float64(after)/churnLive)
	if after > 2*churnLive {
		t.Errorf("the file is %s after defragmentation for %s of values", mib(after), mib(churnLive))
	}
	if done, err := df.check(context.Background(), false); err != nil || done {
		t.Errorf("second check = %v, %v; want nothing to do", done, err)
	}
}

// testDefragger is a defragmenter with thresholds for test-sized data.
func testDefragger(t *testing.T, be Backend) *defragger {
	t.Helper()
	cli, err := newClient(be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return &defragger{
		cli:      cli,
		endpoint: be.Endpoints[0],
		log:      logrus.WithField("component", "etcd-defrag"),
		minShare: defragMinShare,
		minFree:  1 << 20,
		quiet:    200 * time.Millisecond,
	}
}

// fragment leaves about 4 MiB free in the member's file.
func fragment(t *testing.T, be Backend) {
	t.Helper()
	c := newChurner(t, be, 1000, 16)
	for w := range 4 {
		c.write(t, churnValueOf(0, w))
	}
	c.write(t, "")
	c.compact(t)
}

func TestDefragWaitsForOtherMember(t *testing.T) {
	d := startReady(t, etcdTestConfig(t, t.TempDir(), etcdTestTLS(t)))
	be := d.Backend()
	fragment(t, be)
	df := testDefragger(t, be)
	ctx := context.Background()
	if _, err := df.cli.Put(ctx, defragLockKey, "other"); err != nil {
		t.Fatal(err)
	}
	done, err := df.check(ctx, false)
	if done || !errors.Is(err, errDefragDeferred) || !strings.Contains(err.Error(), "member other is defragmenting") {
		t.Fatalf("check while another member holds the lock = %v, %v", done, err)
	}

	if _, err := df.cli.Delete(ctx, defragLockKey); err != nil {
		t.Fatal(err)
	}
	if done, err := df.check(ctx, false); !done || err != nil {
		t.Fatalf("check = %v, %v; want a defragmentation", done, err)
	}
	resp, err := df.cli.Get(ctx, defragLockKey)
	if err != nil || len(resp.Kvs) != 0 {
		t.Errorf("%s left behind (%v): %v", defragLockKey, err, resp.Kvs)
	}
}

func TestDefragWaitsForQuiet(t *testing.T) {
	d := startReady(t, etcdTestConfig(t, t.TempDir(), etcdTestTLS(t)))
	be := d.Backend()
	fragment(t, be)
	df := testDefragger(t, be)
	// More than busyWrites writes in the window even on a loaded machine
	// (CI: one writer made fewer than 100 in 200 ms): eight writers, and a
	// window long enough for 13 of their fsyncs.
	df.quiet = 2 * time.Second

	ctx, cancel := context.WithCancel(context.Background())
	var writers sync.WaitGroup
	started := make(chan struct{}, 8)
	for w := range 8 {
		writers.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				df.cli.Put(ctx, fmt.Sprintf("/registry/busy-%d", w), fmt.Sprint(i))
				if i == 0 {
					started <- struct{}{}
				}
			}
		})
	}
	for range 8 {
		<-started
	}
	done, err := df.check(context.Background(), false)
	if done || !errors.Is(err, errDefragDeferred) || !strings.Contains(err.Error(), "writes in") {
		t.Errorf("check while busy = %v, %v; want it deferred", done, err)
	}
	if done, err := df.check(context.Background(), true); !done || err != nil {
		t.Errorf("check after too many deferrals = %v, %v; want a defragmentation", done, err)
	}
	cancel()
	writers.Wait()
}

func TestDefragRunsUntilCanceled(t *testing.T) {
	if err := Defrag(context.Background(), Backend{Kind: KindSQLite, Endpoints: []string{"unix:///x"}}); err == nil {
		t.Error("Defrag accepted a SQLite datastore")
	}
	d := startReady(t, etcdTestConfig(t, t.TempDir(), etcdTestTLS(t)))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Defrag(ctx, d.Backend()) }()
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("Defrag = %v, want nil once its context ends", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Defrag did not return after its context ended")
	}
}

func TestJitter(t *testing.T) {
	for range 1000 {
		if j := jitter(time.Hour); j < 45*time.Minute || j >= 75*time.Minute {
			t.Fatalf("jitter(1h) = %s", j)
		}
	}
}
