package datastore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// makePrivateDir creates dir, and its missing parents, readable by root only.
// The datastore holds every Secret of the cluster.
func makePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create datastore directory %s: %w: make sure --data-dir is on a writable file system and kelp runs as root", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("restrict datastore directory %s to its owner: %w", dir, err)
	}
	return nil
}

// dirLock keeps two kelp processes from opening the same datastore. The
// kernel drops the lock when the process dies, so a crash leaves none behind.
type dirLock struct {
	f *os.File
}

const lockFileName = "datastore.lock"

func lockDir(dir string) (*dirLock, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open datastore lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := ""
			if b, rerr := os.ReadFile(path); rerr == nil && len(strings.TrimSpace(string(b))) > 0 {
				holder = " (pid " + strings.TrimSpace(string(b)) + ")"
			}
			return nil, fmt.Errorf("datastore %s is in use by another kelp server%s: stop it first, or give this one a different --data-dir", dir, holder)
		}
		return nil, fmt.Errorf("lock datastore %s: %w", path, err)
	}
	// The pid is only a hint for the message above; the lock is what counts.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dirLock{f: f}, nil
}

func (l *dirLock) release() {
	// Closing the only descriptor releases the flock.
	_ = l.f.Close()
}
