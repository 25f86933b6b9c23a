package datastore

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// One name for every datastore moved aside: <name>.before-<why>-<time>,
// then -2, -3…; SQLite's companion files go with their database.
func TestMoveAside(t *testing.T) {
	dataDir := t.TempDir()
	db, err := dbDirOf(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(db, etcdDirName), 0o700); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 28, 14, 0, 0, 0, time.UTC)
	write := func() {
		for _, s := range []string{"", "-wal", "-shm"} {
			if err := os.WriteFile(filepath.Join(db, stateDBName+s), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	base := filepath.Join(db, "state.db.before-restore-20261128T140000Z")
	for _, want := range []string{base, base + "-2"} {
		write()
		got, err := MoveAside(dataDir, KindSQLite, AsideRestore, at)
		if err != nil || got != want {
			t.Fatalf("MoveAside = %q, %v; want %q", got, err, want)
		}
		for _, s := range []string{"", "-wal", "-shm"} {
			if !exists(want+s) || exists(filepath.Join(db, stateDBName+s)) {
				t.Errorf("%s was not moved to %s", stateDBName+s, want+s)
			}
		}
	}
	if got, err := MoveAside(dataDir, KindSQLite, AsideRestore, at); got != "" || err != nil {
		t.Errorf("MoveAside of no database = %q, %v", got, err)
	}
	got, err := MoveAside(dataDir, KindEtcd, AsideMigrate, at)
	if want := filepath.Join(db, "etcd.before-migrate-20261128T140000Z"); got != want || err != nil || !exists(want) {
		t.Errorf("MoveAside of the etcd member = %q, %v; want %q", got, err, want)
	}
}
