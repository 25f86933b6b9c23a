// Package atomicfile writes files whole or not at all, and durably: a crash,
// a power cut or a reader at the wrong moment sees the old content or the
// new, never half a file or an empty one.
//
// kelp writes its state through it. A write goes to a temporary file in
// the same directory (named "."+base+".tmp-*"), which is synced, renamed
// over the target, and then the directory is synced so that the rename
// itself survives a power cut. Without the syncs, a filesystem such as ext4
// may commit the rename before the data and leave a zero-length file.
//
// ReadRegular is the other side, for files whose path someone else chose.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// tempInfix marks the temporary files of this package; RemoveTemps finds a
// crash's leftovers by it. pki used the same marker before it wrote through
// here, so its older leftovers are found too.
const tempInfix = ".tmp-"

func tempPrefix(path string) string { return "." + filepath.Base(path) + tempInfix }

// Write replaces path with data and mode. The directory must exist.
func Write(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := Temp(dir, tempPrefix(path), mode, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Temp is the first half of a durable write, for a caller that renames
// the file into place itself (one that must not replace another file, or
// moves the old one aside first): it makes a new file in dir, named prefix
// and random characters, with mode, lets fill write it, syncs it and
// returns its name. On error nothing is left behind.
func Temp(dir, prefix string, mode os.FileMode, fill func(*os.File) error) (name string, err error) {
	f, err := os.CreateTemp(dir, prefix+"*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	// Chmod, not the mode of create: the umask must not widen or narrow
	// it. Before the data, so that a secret is never readable by others.
	if err := f.Chmod(mode); err != nil {
		return "", err
	}
	if err := fill(f); err != nil {
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return f.Name(), nil
}

// Symlink replaces path with a symbolic link to target. The directory must
// exist.
func Symlink(target, path string) error {
	dir := filepath.Dir(path)
	// A link has no O_EXCL create; a random name avoids another writer's,
	// and symlink(2) fails rather than follow one that exists.
	tmp := filepath.Join(dir, tempPrefix(path)+strconv.FormatUint(rand.Uint64(), 36))
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("link %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("link %s: %w", path, err)
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("link %s: %w", path, err)
	}
	return nil
}

// SyncDir makes the creations, renames and removals of entries in dir
// durable. Code that builds a directory and renames it into place syncs the
// directory before the rename and its parent after.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// RemoveTemps removes what writes into dir left behind when they were
// interrupted by a crash. Call it only while nothing writes into dir, such
// as at start under a lock: it would remove the temporary file of a write
// in progress.
func RemoveTemps(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() || !strings.HasPrefix(e.Name(), ".") || !strings.Contains(e.Name(), tempInfix) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove leftover %s: %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
}
