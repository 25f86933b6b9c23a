package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/datastore"
)

// Target is the datastore a restore replaces.
type Target struct {
	// Kind is datastore.KindSQLite or datastore.KindEtcd: the snapshot
	// must be of it.
	Kind string
	// Force restores a snapshot of another cluster (another server CA).
	Force bool
	// Member is the one-member etcd cluster an etcd restore makes.
	Member datastore.EtcdMember
}

// Restored says what Restore did.
type Restored struct {
	// Backup is where the replaced datastore went (datastore.MoveAside);
	// empty when there was none.
	Backup string
	// DB is the restored database file or etcd member directory.
	DB string
}

// Restore puts the snapshot at path (from Find) in place of the stopped
// server's datastore of to.Kind: every restore, by kelp snapshot restore,
// --cluster-reset-restore-path or the boot guard's rollback, goes through
// it. It checks the snapshot as Verified does before it changes anything
// (a SQLite snapshot's content as it copies it), and keeps the replaced
// datastore beside the new one (datastore.MoveAside).
func (d Dir) Restore(path string, to Target) (Restored, error) {
	switch to.Kind {
	case datastore.KindSQLite:
		return d.restoreSQLite(path, to.Force)
	case datastore.KindEtcd:
		if err := d.Verified(path, datastore.KindEtcd, to.Force); err != nil {
			return Restored{}, err
		}
		backup, err := datastore.RestoreEtcd(d.DataDir, path, to.Member)
		return Restored{Backup: backup, DB: datastore.EtcdDir(d.DataDir)}, err
	}
	return Restored{}, fmt.Errorf("snapshot %s: a %q datastore cannot be restored; nothing was changed", path, to.Kind)
}

func (d Dir) restoreSQLite(path string, force bool) (Restored, error) {
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
	backup, err := datastore.ReplaceSQLite(d.DataDir, tmp, datastore.AsideRestore)
	if err != nil {
		return Restored{}, err
	}
	return Restored{Backup: backup, DB: db}, nil
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
