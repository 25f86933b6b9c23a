package snapshot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Verified finds the snapshot named nameOrPath (a name in the directory,
// or a path to a file with its sidecar beside it) and checks that it is
// whole (its sha256), of the datastore kind, and, unless force, of this
// cluster when this data dir has a server CA. It returns the file's path.
func (d Dir) Verified(nameOrPath, kind string, force bool) (string, error) {
	path := nameOrPath
	if !strings.ContainsRune(nameOrPath, '/') {
		if err := checkName(nameOrPath); err != nil {
			return "", err
		}
		path = filepath.Join(d.path(), nameOrPath)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("snapshot %s: %w: kelp snapshot ls shows the snapshots", nameOrPath, err)
	}
	meta, err := readSidecar(path, filepath.Base(path), fi.Size())
	if err != nil {
		return "", fmt.Errorf("snapshot %s has no valid metadata (%v): it is incomplete, or not a kelp snapshot; nothing was changed", path, err)
	}
	if meta.Datastore != kind {
		return "", fmt.Errorf("snapshot %s is of a %s datastore, not %s; nothing was changed", path, meta.Datastore, kind)
	}
	sum, _, err := hashFile(path)
	if err != nil {
		return "", err
	}
	if sum != meta.SHA256 {
		return "", fmt.Errorf("snapshot %s is corrupt: its sha256 is %s, its metadata says %s; nothing was changed: restore another snapshot", path, sum, meta.SHA256)
	}
	if force {
		return path, nil
	}
	hash, err := serverCAHash(d.DataDir)
	if errors.Is(err, fs.ErrNotExist) {
		// A new machine replacing a lost server: its certificates come
		// from a backup of the old server's tls directory, or are new.
		return path, nil
	}
	if err != nil {
		return "", err
	}
	if hash != meta.CAHash {
		return "", fmt.Errorf("snapshot %s comes from another cluster (its CA hash is %s, this server's is %s): its certificates and tokens would not match this data dir; nothing was changed", path, meta.CAHash, hash)
	}
	return path, nil
}
