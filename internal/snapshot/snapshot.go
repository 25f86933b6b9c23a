package snapshot

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	// The pure-Go SQLite driver kine uses in kelp, registered as "sqlite";
	// its error codes tell a full disk.
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/version"
)

const (
	// DefaultName starts the file name of a snapshot saved without --name.
	DefaultName = "kelp-snapshot"
	sidecarExt  = ".json"
	timeFormat  = "20060102T150405Z"
	// staleAfter is how old an incomplete snapshot or a temporary file must
	// be before prune removes it: younger ones may belong to a save that is
	// still running.
	staleAfter = 10 * time.Minute
	// busyTimeout is how long the SQLite copy waits for a lock the server
	// holds, such as during a WAL checkpoint.
	busyTimeout = 10 * time.Second
	tempInfix   = ".tmp-"
	// etcdAnswerTimeout bounds the wait for the local etcd member to answer
	// before its snapshot is asked for.
	etcdAnswerTimeout = 10 * time.Second
)

// kelpName matches the names Save gives: <name>[-<node>]-<UTC time>.
var kelpName = regexp.MustCompile(`-[0-9]{8}T[0-9]{6}Z$`)

// Metadata is a snapshot's sidecar.
type Metadata struct {
	Name        string `json:"name"`
	KelpVersion string `json:"kelpVersion"`
	// Kubernetes is the version of the apiserver that wrote the data;
	// empty in the sidecars of older kelp.
	Kubernetes string    `json:"kubernetes,omitempty"`
	Datastore  string    `json:"datastore"` // datastore.KindSQLite or KindEtcd
	CAHash     string    `json:"caHash"`    // pki.CAHash of the server CA
	SHA256     string    `json:"sha256"`
	Size       int64     `json:"size"`
	Created    time.Time `json:"created"`
	Node       string    `json:"node,omitempty"`
	// MACKeyID names the key of MAC, an HMAC-SHA256 of the other fields
	// keyed from the server token (mac.go); both are empty in the
	// sidecars of older kelp.
	MACKeyID string `json:"macKeyID,omitempty"`
	MAC      string `json:"mac,omitempty"`
}

// Snapshot is a snapshot file in a Dir or an object on S3.
type Snapshot struct {
	Name string
	// Path is where a snapshot in a Dir is; empty for one on S3.
	Path string
	// Location is file:///<path> or s3://<bucket>/<folder>/<name>.
	Location string
	Size     int64
	// Meta is nil for an incomplete snapshot, and Problem says why.
	Meta    *Metadata
	Problem string
	modTime time.Time
}

// Dir is the snapshot directory of the server whose data dir is DataDir.
type Dir struct {
	DataDir string
	// Path is --snapshot-dir; empty means <data-dir>/server/db/snapshots.
	Path string
	// Node goes into the names and metadata of the snapshots Save takes,
	// and is the node whose snapshots prune removes; empty means the
	// hostname, lowercased as the server's default node name is.
	Node string
	// Token is a server token, or its secret, that a restore checks
	// sidecars with besides the data dir's own: the token of the cluster
	// on a new machine, or the one from before a `kelp token rotate`.
	Token string
}

func (d Dir) node() string {
	if d.Node != "" {
		return d.Node
	}
	host, _ := os.Hostname()
	return strings.ToLower(host)
}

func (d Dir) path() string {
	if d.Path == "" {
		return layout.Server(d.DataDir).Snapshots
	}
	return d.Path
}

// Save takes a snapshot of the server's datastore, which may be running,
// and returns its metadata. The file is complete once it has its name, and
// a snapshot once its sidecar is written.
func (d Dir) Save(ctx context.Context, name string) (Metadata, error) {
	if name == "" {
		name = DefaultName
	}
	if err := checkName(name); err != nil {
		return Metadata{}, err
	}
	kind := datastore.LocalKind(d.DataDir)
	if kind == "" {
		return Metadata{}, fmt.Errorf("no SQLite or embedded etcd datastore in %s: run kelp snapshot on a server, with its --data-dir; %s", layout.Server(d.DataDir).DB, externalHint)
	}
	caHash, err := serverCAHash(d.DataDir)
	if err != nil {
		return Metadata{}, err
	}
	key, err := serverKey(d.DataDir)
	if err != nil {
		return Metadata{}, err
	}
	dir := d.path()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Metadata{}, fmt.Errorf("create snapshot directory %s: %w", dir, err)
	}
	now := time.Now().UTC()
	node := d.node()
	if node != "" {
		name += "-" + node
	}
	name += "-" + now.Format(timeFormat)

	tmpPath, err := atomicfile.Temp(dir, "."+name+tempInfix, 0o600, func(tmp *os.File) error {
		if kind == datastore.KindEtcd {
			return saveEtcd(ctx, d.DataDir, tmp)
		}
		// VACUUM INTO writes the empty file it is given in place.
		return saveSQLite(ctx, datastore.SQLitePath(d.DataDir), tmp.Name())
	})
	if err != nil {
		return Metadata{}, fullHint(fmt.Errorf("create snapshot in %s: %w", dir, err), dir)
	}
	sum, size, err := hashFile(tmpPath)
	if err != nil {
		os.Remove(tmpPath)
		return Metadata{}, err
	}
	meta := Metadata{
		Name:        name,
		KelpVersion: version.Version,
		Kubernetes:  kubernetesVersion(),
		Datastore:   kind,
		CAHash:      caHash,
		SHA256:      sum,
		Size:        size,
		Created:     now,
		Node:        node,
	}
	key.sign(&meta)
	if err := publish(tmpPath, filepath.Join(dir, name), meta); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return Metadata{}, fmt.Errorf("a snapshot named %s exists already: wait a second or pick another --name", name)
		}
		return Metadata{}, fullHint(err, dir)
	}
	return meta, nil
}

// publish gives the complete, synced file at tmp its snapshot name path,
// which must be free, and then writes its sidecar, which makes it a
// snapshot. If the sidecar cannot be written, the file is removed: it could
// not be restored, and the likely cause is a full disk that it fills. On
// error nothing is left behind.
func publish(tmp, path string, meta Metadata) error {
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rename snapshot to %s: %w", path, err)
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err == nil {
		err = atomicfile.SyncDir(filepath.Dir(path))
	}
	if err == nil {
		err = atomicfile.Write(path+sidecarExt, append(b, '\n'), 0o600)
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("write the metadata of snapshot %s, so the snapshot was removed: %w", path, err)
	}
	return nil
}

// fullHint tells what to do when err comes from a full snapshot directory.
func fullHint(err error, dir string) error {
	var se *sqlite.Error
	if errors.Is(err, unix.ENOSPC) || errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_FULL {
		return fmt.Errorf("%w: the file system of the snapshot directory %s is full: free space there, keep fewer snapshots or choose another --snapshot-dir; the snapshots already there are unchanged", err, dir)
	}
	return err
}

const externalHint = "an external datastore (--datastore-endpoint) is backed up with that database's own tools (pg_dump, mysqldump, etcdctl snapshot save)"

// saveSQLite copies the live database at db to dst with VACUUM INTO, which
// reads one consistent transaction, while the server goes on writing. A
// read-only connection cannot change or checkpoint the server's database.
func saveSQLite(ctx context.Context, db, dst string) error {
	dsn := (&url.URL{Scheme: "file", Path: db, RawQuery: fmt.Sprintf("mode=ro&_pragma=busy_timeout(%d)", busyTimeout.Milliseconds())}).String()
	conn, err := sql.Open("sqlite", dsn)
	if err != nil {
		return fmt.Errorf("open SQLite datastore %s: %w", db, err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "VACUUM INTO ?", dst); err != nil {
		return fmt.Errorf("copy SQLite datastore %s: %w", db, err)
	}
	return nil
}

// saveEtcd streams a snapshot from the local etcd member into f.
func saveEtcd(ctx context.Context, dataDir string, f *os.File) error {
	cli, err := datastore.LocalEtcdClient(dataDir)
	if err != nil {
		return fmt.Errorf("connect to embedded etcd: %w", err)
	}
	defer cli.Close()
	// The snapshot stream waits for a connection without end; a member
	// that does not answer a status request soon is not running.
	probe, cancel := context.WithTimeout(ctx, etcdAnswerTimeout)
	_, err = cli.Status(probe, cli.Endpoints()[0])
	cancel()
	if err != nil {
		return fmt.Errorf("embedded etcd at %s does not answer (%w): is kelp server running on this host?", cli.Endpoints()[0], err)
	}
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("embedded etcd snapshot: %w: is kelp server running on this host?", err)
	}
	defer rc.Close()
	if _, err := io.Copy(f, rc); err != nil {
		return fmt.Errorf("embedded etcd snapshot: %w: is kelp server running on this host?", err)
	}
	return nil
}

// hashFile returns the sha256 and size of the file at path.
func hashFile(path string) (sum string, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	size, err = io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), size, nil
}

func serverCAHash(dataDir string) (string, error) {
	path := pki.FilesIn(layout.Server(dataDir).TLS).ServerCA.Cert
	ca, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the cluster CA: %w: run kelp snapshot on a server, with its --data-dir", err)
	}
	return pki.CAHash(ca), nil
}

func checkName(name string) error {
	if name == "" || strings.ContainsRune(name, '/') || strings.HasPrefix(name, ".") || strings.HasSuffix(name, sidecarExt) {
		return fmt.Errorf("snapshot name %q: use a name without '/', not starting with '.' and not ending in %s", name, sidecarExt)
	}
	return nil
}

// List returns the snapshots in the directory, newest first; incomplete
// ones (no valid sidecar) are listed too, after the complete ones.
func (d Dir) List() ([]Snapshot, error) {
	dir := d.path()
	entries, err := d.entries()
	if err != nil {
		return nil, err
	}
	var list []Snapshot
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasPrefix(name, ".") || strings.HasSuffix(name, sidecarExt) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		path := filepath.Join(dir, name)
		s := Snapshot{Name: name, Path: path, Location: fileURL(path), Size: fi.Size(), modTime: fi.ModTime()}
		s.Meta, err = readSidecar(s.Path, name, fi.Size())
		if err != nil {
			s.Problem = err.Error()
		}
		list = append(list, s)
	}
	sortNewestFirst(list)
	return list, nil
}

func fileURL(path string) string {
	return (&url.URL{Scheme: "file", Path: path}).String()
}

// sortNewestFirst orders complete snapshots by creation, newest first,
// and puts the incomplete ones after them, newest file first.
func sortNewestFirst(list []Snapshot) {
	sort.SliceStable(list, func(i, j int) bool {
		a, b := list[i], list[j]
		if (a.Meta == nil) != (b.Meta == nil) {
			return a.Meta != nil
		}
		if a.Meta == nil {
			return a.modTime.After(b.modTime)
		}
		return a.Meta.Created.After(b.Meta.Created)
	})
}

// readSidecar returns the metadata of the snapshot at path, or why it has
// none that can be trusted.
func readSidecar(path, name string, size int64) (*Metadata, error) {
	b, err := os.ReadFile(path + sidecarExt)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errors.New("no metadata")
	}
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	return parseSidecar(b, name, size)
}

// parseSidecar returns the metadata in b of the snapshot name of size
// bytes, or why it cannot be trusted. A negative size is not checked.
func parseSidecar(b []byte, name string, size int64) (*Metadata, error) {
	var m Metadata
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("unreadable metadata: %w", err)
	}
	switch {
	case m.Name != name:
		return nil, fmt.Errorf("metadata names %q", m.Name)
	case m.SHA256 == "" || m.Datastore == "" || m.Created.IsZero():
		return nil, errors.New("metadata incomplete")
	case size >= 0 && m.Size != size:
		return nil, fmt.Errorf("file is %d bytes, metadata says %d", size, m.Size)
	}
	return &m, nil
}

// Delete removes the named snapshots and their sidecars.
func (d Dir) Delete(names ...string) error {
	if len(names) == 0 {
		return nil
	}
	dir := d.path()
	for _, name := range names {
		name = strings.TrimSuffix(name, sidecarExt)
		if err := checkName(name); err != nil {
			return err
		}
		path := filepath.Join(dir, name)
		gone := 0
		for _, p := range []string{path, path + sidecarExt} {
			err := os.Remove(p)
			if errors.Is(err, fs.ErrNotExist) {
				gone++
				continue
			}
			if err != nil {
				return fmt.Errorf("delete snapshot %s: %w", p, err)
			}
		}
		if gone == 2 {
			return fmt.Errorf("no snapshot named %s in %s: kelp snapshot ls shows them", name, dir)
		}
	}
	return atomicfile.SyncDir(dir)
}

// selection says which snapshots a prune considers.
type selection struct {
	// base, if not empty, limits it to the snapshots named <base>-<time>;
	// otherwise it considers all that Save names.
	base string
	// node, if not empty, limits it to the snapshots of that node.
	node string
	// keep is the snapshot just taken: never removed, counted as kept.
	keep string
}

// prune keeps the retention newest complete snapshots that sel selects and
// removes the older ones, as well as incomplete snapshots it selects and
// leftover temporary files, once they are older than a running save could
// be. Files with other names than Save gives are left alone. It returns
// the names it removed.
func (d Dir) prune(retention int, sel selection) ([]string, error) {
	gone, err := prune(context.Background(), d, retention, sel)
	if err != nil {
		return nil, err
	}
	temps, err := d.removeStaleTemps()
	return append(gone, temps...), err
}

var errRetention = errors.New("--retention must be at least 1: use kelp snapshot delete to remove every snapshot")

// toPrune returns the names of list, sorted newest first, that prune
// removes.
func toPrune(list []Snapshot, retention int, sel selection, now time.Time) []string {
	kept := 0
	if sel.keep != "" {
		kept = 1
	}
	var remove []string
	for _, s := range list {
		if s.Name == sel.keep || !savedAs(s.Name, sel.base) || sel.node != "" && !ownedBy(s, sel.node) {
			continue
		}
		switch {
		case s.Meta != nil && kept < retention:
			kept++
		case s.Meta != nil:
			remove = append(remove, s.Name)
		case now.Sub(s.modTime) > staleAfter:
			remove = append(remove, s.Name)
		}
	}
	return remove
}

// savedAs reports whether Save gave name, as <base>-<time> if base is not
// empty. Matching base whole keeps node-1 from pruning the snapshots of
// node-1-b in a shared S3 folder.
func savedAs(name, base string) bool {
	at := kelpName.FindStringIndex(name)
	return at != nil && (base == "" || name[:at[0]] == base)
}

// ownedBy reports whether s is a snapshot of node: by the node its
// metadata names, or, where that has none (an incomplete snapshot), by its
// name, <name>-<node>-<time>.
func ownedBy(s Snapshot, node string) bool {
	if s.Meta != nil && s.Meta.Node != "" {
		return strings.EqualFold(s.Meta.Node, node)
	}
	at := kelpName.FindStringIndex(s.Name)
	return at != nil && strings.HasSuffix(strings.ToLower(s.Name[:at[0]]), "-"+strings.ToLower(node))
}

// entries lists the snapshot directory; one not made yet is empty.
func (d Dir) entries() ([]os.DirEntry, error) {
	entries, err := os.ReadDir(d.path())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read snapshot directory %s: %w", d.path(), err)
	}
	return entries, nil
}

func (d Dir) removeStaleTemps() ([]string, error) {
	dir := d.path()
	entries, err := d.entries()
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") || !strings.Contains(e.Name(), tempInfix) {
			continue
		}
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) <= staleAfter {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("remove leftover %s: %w", e.Name(), err)
		}
		removed = append(removed, e.Name())
	}
	return removed, nil
}

// upgradePrefix starts the names of the snapshots taken before an upgrade.
const upgradePrefix = "pre-upgrade-"

// UpgradeName is the name given to Save for the snapshot taken before an
// upgrade from version from to version to: pre-upgrade-<from>-<to>.
// Whatever a version holds besides letters, digits, '.', '_' and '-'
// becomes '-', so the name is one a file and an S3 key can carry; an empty
// version is "unknown".
func UpgradeName(from, to string) string {
	return upgradePrefix + nameSafe(from) + "-" + nameSafe(to)
}

func nameSafe(v string) string {
	if v == "" {
		return "unknown"
	}
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '-'
	}, v)
}
