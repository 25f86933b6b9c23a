package datastore

import (
	"context"
	"database/sql"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
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
