package datastore

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/k3s-io/kine/pkg/drivers/sqlite"
	"github.com/k3s-io/kine/pkg/endpoint"
	kinetls "github.com/k3s-io/kine/pkg/tls"
	"github.com/sirupsen/logrus"
)

// BenchmarkSQLiteWrites measures what SQLite's synchronous setting costs in
// writes a second through kine, as the apiserver writes: NORMAL as kelp
// ships it (through Start), then NORMAL and FULL on a kine started with
// the same settings and only the DSN changed. With WAL, NORMAL syncs only
// at checkpoints; FULL syncs the WAL at every commit, which is what makes
// a commit survive a power loss. Run it on the disk in question, e.g.
//
//	TMPDIR=/var/lib go test -run '^$' -bench SQLiteWrites -benchtime 2000x ./internal/datastore/
func BenchmarkSQLiteWrites(b *testing.B) {
	// kine and the datastore log at Info to the global logger, which would
	// bury the figures.
	level := logrus.GetLevel()
	logrus.SetLevel(logrus.WarnLevel)
	b.Cleanup(func() { logrus.SetLevel(level) })
	full := strings.Replace(sqlite.DefaultParams, "_synchronous=NORMAL", "_synchronous=FULL", 1)
	if full == sqlite.DefaultParams {
		b.Fatalf("kine's sqlite.DefaultParams no longer say _synchronous=NORMAL: %s", sqlite.DefaultParams)
	}
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("shipped/clients=%d", clients), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			d, err := Start(ctx, Config{DataDir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Stop(context.Background())
			if err := d.WaitReady(ctx); err != nil {
				b.Fatal(err)
			}
			benchWrites(b, d.Backend(), clients)
		})
		for _, mode := range []struct{ name, params string }{{"NORMAL", sqlite.DefaultParams}, {"FULL", full}} {
			b.Run(fmt.Sprintf("synchronous=%s/clients=%d", mode.name, clients), func(b *testing.B) {
				benchWrites(b, startKineWith(b, mode.params), clients)
			})
		}
	}
}

// startKineWith starts kine on a new SQLite database with DSN parameters
// params and the other settings of startKine.
func startKineWith(b *testing.B, params string) Backend {
	dir := b.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	wg := &sync.WaitGroup{}
	b.Cleanup(func() {
		cancel()
		waitGroupTimeout(wg, kineStopTimeout)
	})
	dsn := "sqlite://" + filepath.Join(dir, stateDBName) + "?" + params + "&_kine_disable_startup_vacuum=true"
	cfg, err := endpoint.Listen(ctx, kineConfig("unix://"+filepath.Join(dir, kineSocketName), dsn, wg, kinetls.Config{}))
	if err != nil {
		b.Fatal(err)
	}
	return Backend{Endpoints: cfg.Endpoints}
}

// benchWrites makes b.N writes of a ConfigMap-sized value over 50 keys from
// clients concurrent clients, and reports writes a second.
func benchWrites(b *testing.B, be Backend, clients int) {
	cli, err := newClient(be)
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	value := strings.Repeat("x", 1024)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	b.ResetTimer()
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := cli.Put(ctx, fmt.Sprintf("/registry/bench/%02d", i%50), value)
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "writes/s")
}
