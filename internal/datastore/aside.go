package datastore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// Why a local datastore is moved aside: the word in the name it is kept
// under.
const (
	AsideRestore = "restore"
	AsideMigrate = "migrate"
)

// asideTime is how the time reads in the name of a datastore moved aside.
const asideTime = "20060102T150405Z"

// sqliteFiles are the suffixes of the files of a SQLite database: the WAL,
// shared-memory and journal files belong to the database beside them.
// Moved together, a kept database stays one SQLite can open, and a new one
// never replays the WAL of another.
var sqliteFiles = []string{"", "-wal", "-shm", "-journal"}

// localPath is the database file or member directory of the local
// datastore of kind in db, the datastore directory.
func localPath(db, kind string) (string, error) {
	switch kind {
	case KindSQLite:
		return filepath.Join(db, stateDBName), nil
	case KindEtcd:
		return filepath.Join(db, etcdDirName), nil
	}
	return "", fmt.Errorf("no local datastore of kind %q", kind)
}

// files are the suffixes of the files of kind's local datastore.
func files(kind string) []string {
	if kind == KindSQLite {
		return sqliteFiles
	}
	return []string{""}
}

// MoveAside renames the local datastore of kind in the data dir dataDir to
// <name>.before-<why>-<time>, or -2, -3, … after it when an earlier one
// holds that name (two restores within a second): state.db with its
// WAL, shared-memory and journal files, or the etcd member directory. It
// returns where the database or member directory went, "" when there was
// none. The datastore must be stopped and its lock held (Lock).
func MoveAside(dataDir, kind, why string, at time.Time) (string, error) {
	db, err := dbDirOf(dataDir)
	if err != nil {
		return "", err
	}
	live, err := localPath(db, kind)
	if err != nil {
		return "", err
	}
	suffixes := files(kind)
	if !slices.ContainsFunc(suffixes, func(s string) bool { return exists(live + s) }) {
		return "", nil
	}
	aside := freePath(live+".before-"+why+"-"+at.UTC().Format(asideTime), suffixes)
	kept := ""
	for _, suffix := range suffixes {
		err := os.Rename(live+suffix, aside+suffix)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return kept, fmt.Errorf("move %s aside as %s: %w", live+suffix, aside+suffix, err)
		}
		kept = aside
	}
	return kept, atomicfile.SyncDir(db)
}

// replace puts staged, a database file or member directory made in the
// datastore directory of dataDir, in place of the local datastore of
// kind, moving that aside first (MoveAside); it returns where that went.
// The caller holds the lock.
func replace(dataDir, kind, staged, why string, at time.Time) (string, error) {
	db, err := dbDirOf(dataDir)
	if err != nil {
		return "", err
	}
	live, err := localPath(db, kind)
	if err != nil {
		return "", err
	}
	aside, err := MoveAside(dataDir, kind, why, at)
	if err != nil {
		return aside, fmt.Errorf("%w; nothing was changed", err)
	}
	if err := os.Rename(staged, live); err != nil {
		if aside != "" {
			return aside, fmt.Errorf("put %s in place as %s: %w; the previous datastore is %s", staged, live, err, aside)
		}
		return "", fmt.Errorf("put %s in place as %s: %w; nothing was changed", staged, live, err)
	}
	return aside, atomicfile.SyncDir(db)
}

// ReplaceSQLite puts the SQLite database staged, a file made in the
// datastore directory of dataDir whose WAL holds nothing, in place of the
// stopped server's database, keeping that one (MoveAside, for why); it
// returns where that went, "" when there was none. The caller holds the
// lock (Lock).
func ReplaceSQLite(dataDir, staged, why string) (string, error) {
	return replace(dataDir, KindSQLite, staged, why, time.Now())
}

// dbDirOf is the datastore directory of dataDir.
func dbDirOf(dataDir string) (string, error) {
	return Config{DataDir: dataDir}.dbDir()
}

// freePath returns path, or the first of path-2, path-3, … for which no
// file exists with any of suffixes: a datastore kept aside never takes an
// earlier one's name.
func freePath(path string, suffixes []string) string {
	for n := 1; ; n++ {
		candidate := path
		if n > 1 {
			candidate = fmt.Sprintf("%s-%d", path, n)
		}
		if !slices.ContainsFunc(suffixes, func(s string) bool { return exists(candidate + s) }) {
			return candidate
		}
	}
}
