package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/datastore"
)

// Restored says what Restore did.
type Restored struct {
	// Backup is where the replaced database went; empty when there was none.
	Backup string
	DB     string
}

// Restore puts the SQLite snapshot at path (from Find) in place of the
// server's database, which must be stopped. It checks the snapshot as
// Verified does before it changes anything, its content as it copies it.
// The replaced database is kept beside it as state.db.before-restore-<time>.
func (d Dir) Restore(path string, force bool) (Restored, error) {
	if kind := datastore.LocalKind(d.DataDir); kind == datastore.KindEtcd {
		return Restored{}, fmt.Errorf("the data dir %s holds an embedded etcd datastore and kelp snapshot restore puts SQLite snapshots in place: an etcd snapshot is restored with kelp server --cluster-reset --cluster-reset-restore-path NAME", d.DataDir)
	}
	meta, err := d.check(path, datastore.KindSQLite, force)
	if errors.Is(err, errOtherCluster) {
		return Restored{}, fmt.Errorf("%w; pass --force to restore it anyway", err)
	}
	if err != nil {
		return Restored{}, err
	}

	db := datastore.SQLitePath(d.DataDir)
	if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
		return Restored{}, fmt.Errorf("create datastore directory: %w", err)
	}
	release, err := datastore.Lock(d.DataDir)
	if err != nil {
		return Restored{}, fmt.Errorf("%w: a snapshot is restored while kelp server is stopped", err)
	}
	defer release()

	tmp, err := copyVerified(path, filepath.Dir(db), meta.SHA256)
	if err != nil {
		return Restored{}, err
	}
	defer os.Remove(tmp) // gone once renamed

	r := Restored{DB: db}
	backup := datastore.FreePath(db+".before-restore-"+time.Now().UTC().Format(timeFormat), "", "-wal", "-shm", "-journal")
	// The WAL and shared-memory files belong to the database beside them;
	// moved together, the backup stays a database SQLite can open.
	for _, suffix := range []string{"", "-wal", "-shm", "-journal"} {
		err := os.Rename(db+suffix, backup+suffix)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return Restored{}, fmt.Errorf("move %s aside: %w", db+suffix, err)
		}
		if suffix == "" {
			r.Backup = backup
		}
	}
	if err := os.Rename(tmp, db); err != nil {
		return Restored{}, fmt.Errorf("put the snapshot in place as %s: %w; the previous database is %s", db, err, backup)
	}
	if err := atomicfile.SyncDir(filepath.Dir(db)); err != nil {
		return Restored{}, err
	}
	return r, nil
}

// copyVerified copies the snapshot at src into a synced temporary file in
// dir and returns its name, if its sha256 is want.
func copyVerified(src, dir, want string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	tmp, err := atomicfile.Temp(dir, ".restore"+tempInfix, 0o600, func(out *os.File) error {
		h := sha256.New()
		if _, err := io.Copy(io.MultiWriter(out, h), in); err != nil {
			return fmt.Errorf("copy snapshot %s into %s: %w", src, dir, err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != want {
			return fmt.Errorf("snapshot %s is corrupt: its sha256 is %s, its metadata says %s; nothing was changed: restore another snapshot", src, got, want)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return tmp, nil
}
