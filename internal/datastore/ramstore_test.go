package datastore

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	logrustest "github.com/sirupsen/logrus/hooks/test"
)

// startRAMReady starts a RAM store, waits until it answers and stops it
// when the test ends.
func startRAMReady(t *testing.T, cfg RAMConfig) *Datastore {
	t.Helper()
	return ready(t, "StartRAM", func(ctx context.Context) (*Datastore, error) { return StartRAM(ctx, cfg) })
}

// TestRAMStoreRestartAndReboot checks what a RAM store keeps: everything
// across a restart, nothing once its files are gone (a reboot), and then
// revisions above the ones of before.
func TestRAMStoreRestartAndReboot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ram")
	boot := time.Date(2026, 11, 25, 23, 0, 0, 0, time.UTC)
	cfg := RAMConfig{dir: dir, now: func() time.Time { return boot }}

	d := startRAMReady(t, cfg)
	be := d.Backend()
	if d.Name() != "ram store" {
		t.Errorf("Name = %q", d.Name())
	}
	if want := "unix://" + filepath.Join(dir, kineSocketName); len(be.Endpoints) != 1 || be.Endpoints[0] != want {
		t.Errorf("Endpoints = %v, want [%s]", be.Endpoints, want)
	}
	first := putRevision(t, be, "/registry/leases/kube-node-lease/a", "one")
	if first <= boot.UnixMicro() {
		t.Errorf("first revision of a new RAM store %d, want above %d (its start in microseconds)", first, boot.UnixMicro())
	}
	stopWithin(t, d, 30*time.Second)

	// A restart: kept, and revisions go on.
	d = startRAMReady(t, RAMConfig{dir: dir, now: func() time.Time { return boot.Add(time.Hour) }})
	if got := get(t, d.Backend(), "/registry/leases/kube-node-lease/a"); got != "one" {
		t.Errorf("after a restart got %q, want %q", got, "one")
	}
	last := putRevision(t, d.Backend(), "/registry/leases/kube-node-lease/a", "two")
	if last <= first || last > first+100 {
		t.Errorf("after a restart revision %d, want just above %d", last, first)
	}
	stopWithin(t, d, 30*time.Second)

	// A reboot: the files are gone, the store starts empty, above where
	// the old one was.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	reboot := boot.Add(time.Minute)
	d = startRAMReady(t, RAMConfig{dir: dir, now: func() time.Time { return reboot }})
	if n := count(t, d.Backend(), "/registry/leases/kube-node-lease/a"); n != 0 {
		t.Errorf("after a reboot %d leases, want none", n)
	}
	if rev := putRevision(t, d.Backend(), "/registry/leases/kube-node-lease/a", "three"); rev <= last {
		t.Errorf("after a reboot revision %d, want above %d, the last of the store before", rev, last)
	}
}

// TestRAMStoreDamagedIsDiscarded checks that a RAM store SQLite cannot read
// is replaced by an empty one, as a reboot would, where a damaged
// datastore stops kelp.
func TestRAMStoreDamagedIsDiscarded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, stateDBName)
	if err := os.WriteFile(path, []byte(strings.Repeat("not a database ", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+"-wal", []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startRAMReady(t, RAMConfig{dir: dir})
	put(t, d.Backend(), "/registry/events/default/e", "x")
	if got := get(t, d.Backend(), "/registry/events/default/e"); got != "x" {
		t.Errorf("got %q", got)
	}
}

// TestRAMStoreTableIsKines checks that the table a new RAM store is made
// with is the one kine makes itself: kine would keep a different one.
func TestRAMStoreTableIsKines(t *testing.T) {
	dataDir := t.TempDir()
	d := startReady(t, Config{DataDir: dataDir})
	stopWithin(t, d, 30*time.Second)

	ram := t.TempDir()
	if err := createKineDB(filepath.Join(ram, stateDBName), 0, 1); err != nil {
		t.Fatal(err)
	}
	kines, ours := tableSQL(t, SQLitePath(dataDir)), tableSQL(t, filepath.Join(ram, stateDBName))
	if kines != ours {
		t.Errorf("kine makes\n  %s\nthe RAM store\n  %s", kines, ours)
	}
}

var spaces = regexp.MustCompile(`\s+`)

// tableSQL is the CREATE TABLE of kine's table in the database at path,
// with runs of white space made one space and none inside parentheses.
func tableSQL(t *testing.T, path string) string {
	t.Helper()
	var stmt string
	queryRow(t, path, `SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'kine'`, &stmt)
	stmt = spaces.ReplaceAllString(stmt, " ")
	return strings.NewReplacer("( ", "(", " )", ")").Replace(stmt)
}

// queryRow scans the one row query returns from the SQLite database at
// path, opened read-only, into dest.
func queryRow(t *testing.T, path, query string, dest ...any) {
	t.Helper()
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: path, RawQuery: "mode=ro"}).String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow(query).Scan(dest...); err != nil {
		t.Fatalf("%s: %s: %v", path, query, err)
	}
}

// TestRAMStoreCompactsWhatItHolds checks that compacting a RAM store, as
// the apiserver does (the Compact RPC to its revision less 1000), costs
// what its rows cost: a handful of kine transactions, not one per 1000
// revisions since 0. Its revisions start at the time in microseconds; a
// new store (as after a reboot) once recorded 0 as its compact revision,
// and one left so by an earlier kelp is repaired when kelp starts again.
func TestRAMStoreCompactsWhatItHolds(t *testing.T) {
	hook := logrustest.NewGlobal()
	t.Cleanup(hook.Reset)

	for _, upgraded := range []bool{false, true} {
		t.Run(fmt.Sprintf("upgraded=%v", upgraded), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ram")
			path := filepath.Join(dir, stateDBName)
			d := startRAMReady(t, RAMConfig{dir: dir})
			if upgraded {
				stopWithin(t, d, 30*time.Second)
				execSQL(t, path, `UPDATE kine SET prev_revision = 0 WHERE name = 'compact_rev_key'`)
				d = startRAMReady(t, RAMConfig{dir: dir})
			}
			be := d.Backend()
			var rev int64
			for i := range 1500 {
				rev = putRevision(t, be, fmt.Sprintf("/registry/leases/kube-node-lease/n%d", i%10), "renewed")
			}
			var compactedFrom int64
			queryRow(t, path, `SELECT MAX(prev_revision) FROM kine WHERE name = 'compact_rev_key'`, &compactedFrom)

			cli, err := newClient(be)
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			// Without the fix this compaction runs for days: the deadline
			// fails the test, and stopping the store ends the compaction.
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if _, err := cli.Compact(ctx, rev-1000); err != nil {
				t.Fatalf("compact to %d (from %d): %v", rev-1000, compactedFrom, err)
			}
			if n := compactionTransactions(t, hook, compactedFrom); n < 1 || n > 3 {
				t.Errorf("compacting %d revisions took %d transactions, want 1 to 3", rev-1000-compactedFrom, n)
			}
		})
	}
}

var compactedRE = regexp.MustCompile(`^COMPACT compacted from (\d+) to \d+ in (\d+) transactions`)

// compactionTransactions is how many transactions kine logged for the
// compaction that started at revision from.
func compactionTransactions(t *testing.T, hook *logrustest.Hook, from int64) int {
	t.Helper()
	for _, e := range hook.AllEntries() {
		m := compactedRE.FindStringSubmatch(e.Message)
		if m == nil || m[1] != strconv.FormatInt(from, 10) {
			continue
		}
		n, err := strconv.Atoi(m[2])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	t.Fatalf("kine logged no compaction from revision %d", from)
	return 0
}

// execSQL runs stmt on the SQLite database at path.
func execSQL(t *testing.T, path, stmt string) {
	t.Helper()
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: path}).String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(stmt); err != nil {
		t.Fatalf("%s: %s: %v", path, stmt, err)
	}
}
