package datastore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/layout"
)

const (
	// ramSQLiteParams are sqliteParams with synchronous=OFF: the RAM
	// store's file is on a tmpfs, which a power loss or a kernel crash
	// empties anyway, and in WAL mode a commit is in the file (the page
	// cache) before kine answers, so a killed kelp loses nothing.
	ramSQLiteParams = "_journal_mode=WAL&_busy_timeout=30000&_synchronous=OFF&_txlock=immediate&_stmt_cache_size=20&_kine_disable_startup_vacuum=true&_pragma=journal_size_limit(4194304)"

	// kineTable is the table kine makes in a new SQLite database
	// (kine/pkg/drivers/sqlite), made here for a new RAM store so that its
	// revisions can start where the previous store's cannot have reached;
	// kine then finds it and adds its indexes. TestRAMStoreTableIsKines
	// fails when kine's own differs.
	kineTable = `CREATE TABLE kine (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, created INTEGER, deleted INTEGER, create_revision INTEGER, prev_revision INTEGER, lease INTEGER, value BLOB, old_value BLOB)`
)

// RAMConfig says which server's RAM store to run.
type RAMConfig struct {
	// DataDir is the server's --data-dir; its RAM store is in
	// layout.RAMStore of it.
	DataDir string

	// Test-only overrides; zero means the production default.
	dir          string           // layout.RAMStore(DataDir)
	runDir       string           // where the socket goes when dir is too long (/run/kelp)
	readyTimeout time.Duration    // readyTimeout
	now          func() time.Time // time.Now
}

// StartRAM launches the RAM store of a server on SQLite: a second kine, on
// a SQLite database under /run/kelp, for the resources the apiserver may
// lose at a reboot (Leases and Events; see apiserver.Config.RAMStorage).
// Their writes, nearly all that an idle cluster makes, then never reach
// the disk. A restart of kelp keeps the RAM store; a reboot empties it.
// A database SQLite finds damaged is discarded, as a reboot would; a new
// one starts its revisions at the time in microseconds, above any that the
// store it replaces can have reached (unless the clock went back), so that
// clients that watched the old one start over instead of missing changes.
// Start and the returned Datastore behave as for Start.
func StartRAM(ctx context.Context, cfg RAMConfig) (*Datastore, error) {
	dir := cfg.dir
	if dir == "" {
		if cfg.DataDir == "" {
			return nil, errors.New("RAM store: no data directory given (--data-dir)")
		}
		abs, err := filepath.Abs(cfg.DataDir)
		if err != nil {
			return nil, fmt.Errorf("RAM store: resolve --data-dir %s: %w", cfg.DataDir, err)
		}
		dir = layout.RAMStore(abs)
	}
	now := cfg.now
	if now == nil {
		now = time.Now
	}
	log := logrus.WithField("component", "ram store")
	path := filepath.Join(dir, stateDBName)
	spec := kineSpec{
		desc:         "RAM store " + path,
		dbDir:        dir,
		runDir:       orDefault(cfg.runDir, layout.RunDir),
		dsn:          "sqlite://" + path + "?" + ramSQLiteParams,
		pollInterval: sqlitePollInterval,
		check: func(ctx context.Context) error {
			return prepareRAMStore(ctx, path, now(), log)
		},
	}
	eng, be, err := listenKine(ctx, spec, log)
	if err != nil {
		return nil, err
	}
	be.Kind = KindSQLite
	return newDatastore("ram store", spec.desc, eng, be, orDefault(cfg.readyTimeout, readyTimeout), log), nil
}

// prepareRAMStore readies the database at path for kine: one left by an
// earlier run is kept unless SQLite finds it damaged; otherwise a new one
// is made whose first revision follows now in microseconds.
func prepareRAMStore(ctx context.Context, path string, now time.Time, log *logrus.Entry) error {
	if nonEmpty(path) {
		problems, err := quickCheck(ctx, path)
		if err != nil && !isCorrupt(err) {
			return fmt.Errorf("check RAM store %s: %w", path, err)
		}
		if err == nil && len(problems) == 0 {
			return stepOverEmptyRevisions(ctx, path, log)
		}
		why := strings.Join(problems, "; ")
		if err != nil {
			why = err.Error()
		}
		log.Warnf("RAM store %s is damaged (%s): starting an empty one, as after a reboot: nodes renew their leases, and the events recorded so far are gone", path, why)
	}
	// A WAL without its database, or beside a discarded one, must not be
	// replayed into the new one.
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", f, err)
		}
	}
	return createKineDB(path, 0, now.UnixMicro())
}

// createKineDB makes a SQLite database with kine's table, under a
// temporary name renamed to path once complete: with pages of pageSize
// bytes (0: SQLite's default) and, if firstRevision is not 0, a next
// revision of firstRevision+1 and firstRevision as its compact revision.
// kine would record 0 as the compact revision, and it compacts a range of
// revisions in transactions of CompactBatchSize revisions whether they hold
// rows or not: from 0 to a revision near 1.8e15 (the time in microseconds)
// that is 1.8e12 transactions, a core busy for ever from the apiserver's
// first compaction on.
func createKineDB(path string, pageSize int, firstRevision int64) error {
	tmp := path + ".new"
	for _, f := range []string{tmp, tmp + "-journal"} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", f, err)
		}
	}
	db, err := openSQLite(tmp)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	defer db.Close()
	if pageSize != 0 {
		if _, err := db.Exec(fmt.Sprintf("PRAGMA page_size = %d", pageSize)); err != nil {
			return fmt.Errorf("create %s: set its page size: %w", tmp, err)
		}
	}
	tx, err := db.Begin()
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.Exec(kineTable); err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if firstRevision != 0 {
		if _, err := tx.Exec(`INSERT INTO sqlite_sequence (name, seq) VALUES ('kine', ?)`, firstRevision); err != nil {
			return fmt.Errorf("create %s: set its first revision: %w", tmp, err)
		}
		// The row kine's compactStart would add, as it adds it, but with
		// the compact revision where the revisions start.
		if _, err := tx.Exec(`INSERT INTO kine (name, created, deleted, create_revision, prev_revision, lease, value, old_value) VALUES ('compact_rev_key', 1, 0, NULL, ?, 0, x'', NULL)`, firstRevision); err != nil {
			return fmt.Errorf("create %s: set its compact revision: %w", tmp, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("create SQLite database: %w", err)
	}
	return nil
}

// compactionGap is the most revisions without rows that may lie above a
// store's compact revision before stepOverEmptyRevisions closes the gap:
// kine compacts them in transactions of CompactBatchSize revisions.
const compactionGap = 1000

// stepOverEmptyRevisions raises the compact revision of the kine database
// at path over revisions that hold no rows, when there are more than
// compactionGap of them, so that compacting costs what the rows cost. A
// RAM store made by an earlier kelp recorded 0 as its compact revision
// below revisions that start at the time in microseconds. No row is
// deleted: watching from a revision in the gap is then refused as
// compacted, and the client lists again, as after any compaction.
func stepOverEmptyRevisions(ctx context.Context, path string, log *logrus.Entry) error {
	db, err := openSQLite(path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer func() { _ = tx.Rollback() }()
	var compact, first sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT MAX(prev_revision) FROM kine WHERE name = 'compact_rev_key'`).Scan(&compact); err != nil {
		return fmt.Errorf("read the compact revision of %s: %w", path, err)
	}
	if !compact.Valid {
		return nil
	}
	if err := tx.QueryRowContext(ctx, `SELECT MIN(id) FROM kine WHERE id > ?`, compact.Int64).Scan(&first); err != nil {
		return fmt.Errorf("read the first revision of %s: %w", path, err)
	}
	if !first.Valid || first.Int64-1-compact.Int64 <= compactionGap {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE kine SET prev_revision = ? WHERE name = 'compact_rev_key'`, first.Int64-1); err != nil {
		return fmt.Errorf("raise the compact revision of %s: %w", path, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("raise the compact revision of %s: %w", path, err)
	}
	log.Infof("Raised the compact revision of %s from %d to %d over revisions without rows, so that compacting it costs what its rows cost", path, compact.Int64, first.Int64-1)
	return nil
}

// openSQLite opens the SQLite database at path, with one connection, for
// kelp's own changes before kine starts on it.
func openSQLite(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: path}).String())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	return db, nil
}
