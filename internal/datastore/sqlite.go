package datastore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"

	// kine's SQLite driver when built without cgo, as kelp is; the check
	// uses it in every build.
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// checkSQLite refuses a state.db that SQLite cannot read, before kine gets
// it: kine would run CREATE TABLE and VACUUM on whatever it is given. The
// check opens the file read-only, so it never changes a byte of it, and runs
// PRAGMA quick_check, which reads every page but skips the costly
// index-content comparisons of integrity_check. A missing or empty file is
// a new datastore and passes: fresh.
func checkSQLite(ctx context.Context, path string) (fresh bool, _ error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("SQLite datastore %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return false, fmt.Errorf("SQLite datastore %s is not a regular file: move it away", path)
	}
	if fi.Size() == 0 {
		return true, nil
	}

	problems, err := quickCheck(ctx, path)
	if err != nil && !isCorrupt(err) {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return false, fmt.Errorf("check SQLite datastore %s: %w", path, err)
	}
	if err != nil {
		return false, fmt.Errorf("SQLite datastore %s is not a valid SQLite database or is corrupt (%v): restore it from a backup, or move it away to start an empty datastore; kelp has not changed it", path, err)
	}
	if len(problems) > 0 {
		return false, fmt.Errorf("SQLite datastore %s is corrupt (%s): restore it from a backup, or move it away to start an empty datastore; kelp has not changed it", path, strings.Join(problems, "; "))
	}
	return false, nil
}

// quickCheck returns what PRAGMA quick_check found wrong, at most a few lines.
func quickCheck(ctx context.Context, path string) ([]string, error) {
	// mode=ro opens the database file read-only, so SQLite can neither write
	// nor checkpoint it. A read-only connection to a WAL database still
	// creates empty -wal and -shm files beside it, though; when there is no
	// WAL or rollback journal to read, immutable=1 avoids that, and is exact,
	// because then the database file alone holds all the data.
	// A lock another connection holds a moment (a checkpoint, a copy by
	// kelp snapshot save) is waited for, as kine waits for its own.
	params := "mode=ro&_pragma=busy_timeout(10000)"
	if !exists(path+"-wal") && !exists(path+"-journal") {
		params += "&immutable=1"
	}
	dsn := (&url.URL{Scheme: "file", Path: path, RawQuery: params}).String()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)

	rows, err := db.QueryContext(ctx, "PRAGMA quick_check(3)")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return nil, err
		}
		if line != "ok" {
			problems = append(problems, strings.ReplaceAll(line, "\n", "; "))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return problems, nil
}

// isCorrupt tells SQLite's "this is no database" and "this database is
// damaged" from failures to read the file at all.
func isCorrupt(err error) bool {
	var serr *sqlite.Error
	if !errors.As(err, &serr) {
		return false
	}
	switch serr.Code() & 0xff {
	case sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT:
		return true
	}
	return false
}

func nonEmpty(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Size() > 0
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// checkpoint writes everything the WAL of the SQLite database at path holds
// into the database file and empties the WAL, so that the file alone holds
// the data and can be moved without its -wal. Closing the last connection
// usually does that, but not when a connection was left open or its close
// failed; a database that never reached an automatic checkpoint then has
// an empty file and all of its data in the WAL.
func checkpoint(ctx context.Context, path string) error {
	dsn := (&url.URL{Scheme: "file", Path: path, RawQuery: "_pragma=busy_timeout(10000)"}).String()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return fmt.Errorf("checkpoint SQLite database %s: %w", path, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	var busy, walPages, checkpointed int
	if err := db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &walPages, &checkpointed); err != nil {
		return fmt.Errorf("checkpoint SQLite database %s: %w", path, err)
	}
	if busy != 0 {
		return fmt.Errorf("checkpoint SQLite database %s: another connection holds it", path)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("checkpoint SQLite database %s: %w", path, err)
	}
	if nonEmpty(path + "-wal") {
		return fmt.Errorf("checkpoint SQLite database %s: its WAL is not empty after the checkpoint", path)
	}
	return nil
}
