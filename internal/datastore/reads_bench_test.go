package datastore

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkSQLiteReads measures what kine's reads of many objects cost, as
// the apiserver makes them when its watch cache does not answer (at start,
// with --watch-cache-sizes=R#0, or an exact resourceVersion it has no
// snapshot of): a whole prefix in one range ("list"), the same in pages of
// 500 at the first page's revision ("paged", one op per whole list: each page
// is a range and, since more follow, a count of the rest), a count of the
// prefix ("count", the apiserver's object-count poll) and one key ("get").
// The database holds ConfigMaps of 1 KiB (and, at 10,000, of 4 KiB too) in
// one namespace and 2,000 other objects, written straight into kine's table.
// Each variant adds one setting to the shipped DSN, or has the database made
// with SQLite's 4 KiB pages instead of a new datastore's 1 KiB ones. Run it
// on a real disk (TMPDIR), e.g.
//
//	TMPDIR=/var/lib go test -run '^$' -bench SQLiteReads -benchtime 5x ./internal/datastore/
func BenchmarkSQLiteReads(b *testing.B) {
	level := logrus.GetLevel()
	logrus.SetLevel(logrus.WarnLevel)
	b.Cleanup(func() { logrus.SetLevel(level) })
	const prefix, end = "/registry/configmaps/default/", "/registry/configmaps/default0"
	variants := []struct {
		name, params string
		pageSize     int
	}{
		{name: "shipped", params: sqliteParams, pageSize: sqlitePageSize},
		{name: "page_size=4096", params: sqliteParams, pageSize: 4096},
		{name: "temp_store=memory", params: sqliteParams + "&_pragma=temp_store(2)", pageSize: sqlitePageSize},
		{name: "cache_size=64MiB", params: sqliteParams + "&_pragma=cache_size(-65536)", pageSize: sqlitePageSize},
		{name: "mmap_size=256MiB", params: sqliteParams + "&_pragma=mmap_size(268435456)", pageSize: sqlitePageSize},
	}
	for _, data := range []struct{ objects, size int }{{10000, 1024}, {10000, 4096}, {50000, 1024}} {
		objects := data.objects
		b.Run(fmt.Sprintf("objects=%d/size=%d", objects, data.size), func(b *testing.B) {
			// A database per page size, shared by the variants of it.
			dirs := map[int]string{}
			for _, v := range variants {
				if dirs[v.pageSize] != "" {
					continue
				}
				dirs[v.pageSize] = b.TempDir()
				if err := fillKineDB(filepath.Join(dirs[v.pageSize], stateDBName), v.pageSize, objects, data.size); err != nil {
					b.Fatal(err)
				}
			}
			for _, v := range variants {
				b.Run(v.name, func(b *testing.B) {
					be, stop := listenKineAt(b, dirs[v.pageSize], v.params)
					defer stop()
					cli, err := newClient(be)
					if err != nil {
						b.Fatal(err)
					}
					defer cli.Close()
					ctx := context.Background()
					for _, k := range []struct {
						name string
						read func() (int, error)
					}{
						{"list", func() (int, error) {
							r, err := cli.Get(ctx, prefix, clientv3.WithRange(end))
							if err != nil {
								return 0, err
							}
							return len(r.Kvs), nil
						}},
						{"paged", func() (int, error) {
							n, key, rev := 0, prefix, int64(0)
							for {
								r, err := cli.Get(ctx, key, clientv3.WithRange(end), clientv3.WithLimit(500), clientv3.WithRev(rev))
								if err != nil {
									return 0, err
								}
								n += len(r.Kvs)
								if !r.More {
									return n, nil
								}
								key, rev = string(r.Kvs[len(r.Kvs)-1].Key)+"\x00", r.Header.Revision
							}
						}},
						{"count", func() (int, error) {
							r, err := cli.Get(ctx, prefix, clientv3.WithRange(end), clientv3.WithCountOnly())
							if err != nil {
								return 0, err
							}
							return int(r.Count), nil
						}},
						{"get", func() (int, error) {
							r, err := cli.Get(ctx, fmt.Sprintf("%scm-%06d", prefix, objects/2))
							if err != nil {
								return 0, err
							}
							return len(r.Kvs) * objects, nil
						}},
					} {
						b.Run(k.name, func(b *testing.B) {
							for b.Loop() {
								n, err := k.read()
								if err != nil {
									b.Fatalf("%s: %v", k.name, err)
								}
								if n != objects {
									b.Fatalf("%s read %d objects, want %d", k.name, n, objects)
								}
							}
						})
					}
				})
			}
		})
	}
}

// fillKineDB creates a kine database at path, with pages of pageSize bytes,
// holding objects ConfigMaps of size bytes named cm-NNNNNN in the default
// namespace and 2,000 other objects, one revision each, as kine writes a
// create. kine adds its indexes when it opens the database.
func fillKineDB(path string, pageSize, objects, size int) error {
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: path}).String())
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(fmt.Sprintf("PRAGMA page_size = %d", pageSize)); err != nil {
		return fmt.Errorf("create %s: set its page size: %w", path, err)
	}
	tx, err := db.Begin()
	if err != nil {
		return fmt.Errorf("fill %s: %w", path, err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.Exec(kineTable); err != nil {
		return fmt.Errorf("fill %s: %w", path, err)
	}
	insert, err := tx.Prepare(`INSERT INTO kine (name, created, deleted, create_revision, prev_revision, lease, value, old_value) VALUES (?, 1, 0, 0, 0, 0, ?, NULL)`)
	if err != nil {
		return fmt.Errorf("fill %s: %w", path, err)
	}
	defer insert.Close()
	value := []byte(strings.Repeat("v", max(size, 500)))
	for i := range 1000 {
		if _, err := insert.Exec(fmt.Sprintf("/registry/leases/kube-system/lease-%04d", i), value[:300]); err != nil {
			return fmt.Errorf("fill %s: %w", path, err)
		}
	}
	for i := range objects {
		if _, err := insert.Exec(fmt.Sprintf("/registry/configmaps/default/cm-%06d", i), value[:size]); err != nil {
			return fmt.Errorf("fill %s: %w", path, err)
		}
	}
	for i := range 1000 {
		if _, err := insert.Exec(fmt.Sprintf("/registry/events/default/event-%04d", i), value[:500]); err != nil {
			return fmt.Errorf("fill %s: %w", path, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("fill %s: %w", path, err)
	}
	return db.Close()
}
