package embed

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/layout"
)

// ErrCorrupt is wrapped by every error about a bundle that does not match its
// hash or its MANIFEST.
var ErrCorrupt = errors.New("runtime bundle is corrupt")

const (
	manifestName    = "MANIFEST" // first tar entry: "<sha256> <size> <path>" per file
	maxManifestSize = 1 << 20
	markerName      = ".staged" // written last, so a dir without it is unfinished
	lockName        = ".lock"
	currentLink     = "current"  // the bundle the last Stage call returned
	previousLink    = "previous" // the one before; kept for shims still running it
	partialInfix    = ".partial-"
)

// stage puts the bundle whose compressed archive has sha256 hash under
// <dataDir>/data/<hash>. archive is read only when the bundle must be extracted.
//
// Layout of <dataDir>/data: one dir per bundle hash, the symlinks current and
// previous, and .lock. Every change to it happens under an flock on .lock, so
// that two kelp processes starting at once extract a bundle only once.
func stage(dataDir, hash string, archive io.Reader) (Staged, error) {
	if !isHash(hash) {
		return Staged{}, fmt.Errorf("bundle hash %q is not a sha256 hex digest", hash)
	}
	root := layout.BundleDir(dataDir)
	dir := filepath.Join(root, hash)

	// Fast path, taken on every start but the first after an install or
	// upgrade: no lock, no hashing.
	if target, err := os.Readlink(filepath.Join(root, currentLink)); err == nil && target == hash && isStaged(dir) {
		return stagedAt(dir), nil
	}

	if err := os.MkdirAll(root, 0o755); err != nil {
		return Staged{}, fmt.Errorf("create bundle dir: %w", err)
	}
	unlock, err := lock(filepath.Join(root, lockName))
	if err != nil {
		return Staged{}, err
	}
	defer unlock()

	log := logrus.WithField("component", "embed")
	// Whatever a crashed run left half-done is garbage now that we hold the lock.
	if err := removeLeftovers(root); err != nil {
		return Staged{}, err
	}
	if !isStaged(dir) {
		if err := os.RemoveAll(dir); err != nil {
			return Staged{}, fmt.Errorf("remove unfinished bundle dir: %w", err)
		}
		if err := extract(root, hash, archive); err != nil {
			return Staged{}, err
		}
		log.Infof("Staged runtime bundle in %s", dir)
	}
	previous, err := setCurrent(root, hash)
	if err != nil {
		return Staged{}, err
	}
	// A failed prune leaves only disk space behind; the bundle is ready.
	if err := prune(root, hash, previous); err != nil {
		log.Warnf("Pruning old runtime bundles: %v", err)
	}
	return stagedAt(dir), nil
}

func isStaged(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, markerName))
	return err == nil
}

// lock takes an exclusive flock on path, waiting for any other holder.
func lock(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open bundle lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Closing the file releases the lock.
	return func() { f.Close() }, nil
}

// removeLeftovers removes half-extracted bundle dirs and the temporary
// links of an interrupted symlink swap.
func removeLeftovers(root string) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("read bundle dir: %w", err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), partialInfix) {
			if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
				return fmt.Errorf("remove leftover of an interrupted staging: %w", err)
			}
		}
	}
	if err := atomicfile.RemoveTemps(root); err != nil {
		return fmt.Errorf("remove leftover of an interrupted staging: %w", err)
	}
	return nil
}

// extract unpacks archive into a temporary dir next to its final place,
// verifies it, makes it durable and renames it into place. On error nothing
// of it is left behind.
func extract(root, hash string, archive io.Reader) (err error) {
	tmp, err := os.MkdirTemp(root, hash+partialInfix)
	if err != nil {
		return fmt.Errorf("create staging dir: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()

	sum := sha256.New()
	if err := unpack(tmp, io.TeeReader(archive, sum)); err != nil {
		return err
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != hash {
		return fmt.Errorf("%w: archive sha256 is %s, want %s; reinstall kelp", ErrCorrupt, got, hash)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	// The marker goes last, and its write syncs tmp: every entry and the
	// mode are durable before the rename publishes the dir.
	if err := atomicfile.Write(filepath.Join(tmp, markerName), []byte(hash+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(root, hash)); err != nil {
		return fmt.Errorf("move staged bundle into place: %w", err)
	}
	return atomicfile.SyncDir(root)
}

type manifestEntry struct {
	sum  string
	size int64
	seen bool
}

// unpack writes every file of the tar.zst stream r into dir, checking each
// against the MANIFEST that must come first, and reads r to its end.
func unpack(dir string, r io.Reader) error {
	dec, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
	if err != nil {
		return fmt.Errorf("open bundle: %w", err)
	}
	defer dec.Close()
	tr := tar.NewReader(dec)

	hdr, err := tr.Next()
	if err != nil {
		return fmt.Errorf("%w: read first entry: %v", ErrCorrupt, err)
	}
	if hdr.Name != manifestName || hdr.Typeflag != tar.TypeReg || hdr.Size > maxManifestSize {
		return fmt.Errorf("%w: first entry is %q, want %s", ErrCorrupt, hdr.Name, manifestName)
	}
	manifest, err := parseManifest(tr)
	if err != nil {
		return err
	}

	dirs := map[string]bool{dir: true}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		want, ok := manifest[hdr.Name]
		switch {
		case !ok:
			return fmt.Errorf("%w: %s is not in MANIFEST", ErrCorrupt, hdr.Name)
		case want.seen:
			return fmt.Errorf("%w: %s appears twice", ErrCorrupt, hdr.Name)
		case hdr.Typeflag != tar.TypeReg:
			return fmt.Errorf("%w: %s is not a regular file", ErrCorrupt, hdr.Name)
		case hdr.Size != want.size:
			return fmt.Errorf("%w: %s has %d bytes, MANIFEST says %d", ErrCorrupt, hdr.Name, hdr.Size, want.size)
		}
		want.seen = true
		target := filepath.Join(dir, filepath.FromSlash(hdr.Name))
		parent := filepath.Dir(target)
		if !dirs[parent] {
			if err := os.MkdirAll(parent, 0o755); err != nil {
				return err
			}
			// Every dir MkdirAll made holds a new entry to sync.
			for d := parent; !dirs[d]; d = filepath.Dir(d) {
				dirs[d] = true
			}
		}
		got, err := writeVerified(target, hdr.Name, tr, fs.FileMode(hdr.Mode)&0o755)
		if err != nil {
			return err
		}
		if got != want.sum {
			return fmt.Errorf("%w: %s has sha256 %s, MANIFEST says %s; reinstall kelp", ErrCorrupt, hdr.Name, got, want.sum)
		}
	}
	for name, e := range manifest {
		if !e.seen {
			return fmt.Errorf("%w: %s is in MANIFEST but not in the archive", ErrCorrupt, name)
		}
	}
	// The whole stream counts for the archive hash, including what follows
	// the tar's end.
	if _, err := io.Copy(io.Discard, dec); err != nil {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("read bundle: %w", err)
	}
	for d := range dirs {
		if err := atomicfile.SyncDir(d); err != nil {
			return err
		}
	}
	return nil
}

func parseManifest(r io.Reader) (map[string]*manifestEntry, error) {
	entries := map[string]*manifestEntry{}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 {
			return nil, fmt.Errorf("%w: MANIFEST line %d: want \"<sha256> <size> <path>\"", ErrCorrupt, line)
		}
		sum, name := fields[0], fields[2]
		size, err := strconv.ParseInt(fields[1], 10, 64)
		switch {
		case !isHash(sum):
			return nil, fmt.Errorf("%w: MANIFEST line %d: bad sha256 %q", ErrCorrupt, line, sum)
		case err != nil || size < 0:
			return nil, fmt.Errorf("%w: MANIFEST line %d: bad size %q", ErrCorrupt, line, fields[1])
		case !safePath(name):
			return nil, fmt.Errorf("%w: MANIFEST line %d: path %q leaves the bundle dir", ErrCorrupt, line, name)
		case entries[name] != nil:
			return nil, fmt.Errorf("%w: MANIFEST lists %s twice", ErrCorrupt, name)
		}
		entries[name] = &manifestEntry{sum: sum, size: size}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: read MANIFEST: %v", ErrCorrupt, err)
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("%w: MANIFEST is empty", ErrCorrupt)
	}
	return entries, nil
}

// safePath accepts clean relative slash paths that stay inside the bundle
// dir and do not collide with the files staging itself writes.
func safePath(name string) bool {
	return filepath.IsLocal(name) && path.Clean(name) == name && !strings.Contains(name, `\`) &&
		name != manifestName && name != markerName
}

// writeVerified writes r, the bundle file name, to a new file at path, syncs
// it and returns the sha256 of what it wrote. It streams rather than goes
// through atomicfile: the file is new in a private dir that one rename
// publishes whole, and binaries are too large to hold in memory.
func writeVerified(path, name string, r io.Reader, mode fs.FileMode) (string, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return "", fmt.Errorf("create %s: %w", path, err)
	}
	// The archive decides the mode, not the umask.
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return "", err
	}
	h := sha256.New()
	src := &readTracker{r: r}
	if _, err := io.Copy(io.MultiWriter(f, h), src); err != nil {
		f.Close()
		if src.err != nil {
			return "", fmt.Errorf("%w: read %s: %v", ErrCorrupt, name, src.err)
		}
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("close %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// readTracker remembers a read error, to tell a damaged archive from a full disk.
type readTracker struct {
	r   io.Reader
	err error
}

func (t *readTracker) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF {
		t.err = err
	}
	return n, err
}

// setCurrent points current at hash and previous at what current pointed to
// before, and returns the hash previous now names ("" if none).
func setCurrent(root, hash string) (string, error) {
	old, _ := os.Readlink(filepath.Join(root, currentLink))
	previous, _ := os.Readlink(filepath.Join(root, previousLink))
	if old == hash {
		return previous, nil
	}
	if isHash(old) && isStaged(filepath.Join(root, old)) {
		if err := atomicfile.Symlink(old, filepath.Join(root, previousLink)); err != nil {
			return "", err
		}
		previous = old
	}
	if err := atomicfile.Symlink(hash, filepath.Join(root, currentLink)); err != nil {
		return "", err
	}
	return previous, nil
}

// prune removes bundle dirs other than current and previous. previous is
// kept because containerd shims started before an upgrade still exec runc
// from it.
func prune(root, current, previous string) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !isHash(name) || name == current || name == previous {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
