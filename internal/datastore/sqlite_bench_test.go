package datastore

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/k3s-io/kine/pkg/endpoint"
	kinetls "github.com/k3s-io/kine/pkg/tls"
	"github.com/sirupsen/logrus"
)

// BenchmarkSQLiteWrites measures what one write through kine costs, as an
// idle cluster writes: a small object (a Lease, 400 bytes) updated over and
// over, by one client and by eight. It reports writes a second and bytes
// written a write: the WAL frames of its commit and, shared out, the
// checkpoints that copy them into state.db, as the kernel counts them for
// this process (/proc/self/io write_bytes; the file system's own journal
// comes on top). Each variant changes one setting of the shipped DSN; every
// one keeps synchronous=FULL but the one that says otherwise, there to show
// what FULL costs: with WAL, NORMAL syncs only at checkpoints, FULL syncs
// the WAL at every commit, which is what makes a commit survive a power
// loss. Run it on a real disk (TMPDIR), e.g.
//
//	TMPDIR=/var/lib go test -run '^$' -bench SQLiteWrites -benchtime 2000x ./internal/datastore/
func BenchmarkSQLiteWrites(b *testing.B) {
	level := logrus.GetLevel()
	logrus.SetLevel(logrus.WarnLevel)
	b.Cleanup(func() { logrus.SetLevel(level) })
	for _, v := range []struct {
		name     string
		params   string
		pageSize int // 0: SQLite's default, 4096
	}{
		{name: "shipped", params: sqliteParams},
		{name: "synchronous=NORMAL", params: strings.Replace(sqliteParams, "_synchronous=FULL", "_synchronous=NORMAL", 1)},
		{name: "page_size=1024", params: sqliteParams, pageSize: 1024},
		{name: "page_size=2048", params: sqliteParams, pageSize: 2048},
		{name: "wal_autocheckpoint=10000", params: sqliteParams + "&_pragma=wal_autocheckpoint(10000)"},
		{name: "wal_autocheckpoint=100", params: sqliteParams + "&_pragma=wal_autocheckpoint(100)"},
		{name: "journal_size_limit=none", params: strings.Replace(sqliteParams, "&_pragma=journal_size_limit(16777216)", "", 1)},
	} {
		if v.params == sqliteParams && v.pageSize == 0 && v.name != "shipped" {
			b.Fatalf("variant %s no longer changes the shipped DSN %s", v.name, sqliteParams)
		}
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/clients=%d", v.name, clients), func(b *testing.B) {
				dir := b.TempDir()
				path := filepath.Join(dir, stateDBName)
				if v.pageSize != 0 {
					if err := createKineDB(path, v.pageSize, 0); err != nil {
						b.Fatal(err)
					}
				}
				be, stop := listenKineAt(b, dir, v.params)
				cli, err := newClient(be)
				if err != nil {
					b.Fatal(err)
				}
				defer cli.Close()
				value := strings.Repeat("l", 400)
				put := func(i int64) error {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					_, err := cli.Put(ctx, fmt.Sprintf("/registry/leases/kube-node-lease/node-%02d", i%20), value)
					return err
				}
				// The keys exist, as a cluster's leases do.
				for i := range int64(20) {
					if err := put(i); err != nil {
						b.Fatal(err)
					}
				}
				before := writeBytes(b)
				var next atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, clients)
				b.ResetTimer()
				start := time.Now()
				for range clients {
					wg.Go(func() {
						for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
							if err := put(i); err != nil {
								errs <- err
								return
							}
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				// Stopping checkpoints the rest of the WAL into state.db.
				stop()
				b.StopTimer()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "writes/s")
				b.ReportMetric(float64(writeBytes(b)-before)/float64(b.N), "bytes/write")
			})
		}
	}
}

// listenKineAt starts kine on the SQLite database in dir with DSN
// parameters params and the other settings of startKine; stop stops it.
func listenKineAt(b *testing.B, dir, params string) (_ Backend, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	wg := &sync.WaitGroup{}
	stop = func() {
		cancel()
		waitGroupTimeout(wg, kineStopTimeout)
	}
	b.Cleanup(stop)
	dsn := "sqlite://" + filepath.Join(dir, stateDBName) + "?" + params
	cfg, err := endpoint.Listen(ctx, kineConfig("unix://"+filepath.Join(dir, kineSocketName), dsn, wg, kinetls.Config{}))
	if err != nil {
		b.Fatal(err)
	}
	return Backend{Endpoints: cfg.Endpoints}, stop
}

// writeBytes is what this process has made the kernel write to storage.
func writeBytes(b *testing.B) int64 {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		b.Skipf("no /proc/self/io: %v", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "write_bytes: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no write_bytes in /proc/self/io")
	return 0
}
