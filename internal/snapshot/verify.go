package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/version"
)

// Found is the local file of the snapshot a restore names.
type Found struct {
	Path string
	// FetchedFrom is the s3:// location it was downloaded from; empty when
	// it was local already.
	FetchedFrom string
}

// Find returns the local file of the snapshot that a restore names, for
// SQLite and etcd alike. A path (it has a '/', or a file of that name
// exists where kelp runs) is that file. A bare name is looked for in the
// snapshot directory, and only if it is not there, with s3 not nil, on S3,
// from where it is downloaded into the snapshot directory. So an S3 that
// is down never stands in the way of a local snapshot, and asking it is
// bounded by its timeout. The error names every place Find looked.
func (d Dir) Find(ctx context.Context, nameOrPath string, s3 *config.S3) (Found, error) {
	if strings.ContainsRune(nameOrPath, '/') {
		if _, err := os.Stat(nameOrPath); err != nil {
			return Found{}, fmt.Errorf("snapshot %w", err)
		}
		return Found{Path: nameOrPath}, nil
	}
	if fi, err := os.Stat(nameOrPath); err == nil && fi.Mode().IsRegular() {
		abs, err := filepath.Abs(nameOrPath)
		if err != nil {
			return Found{}, err
		}
		return Found{Path: abs}, nil
	}
	if err := checkName(nameOrPath); err != nil {
		return Found{}, err
	}
	looked := []string{"./" + nameOrPath}
	path := filepath.Join(d.path(), nameOrPath)
	_, err := os.Stat(path)
	if err == nil {
		return Found{Path: path}, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return Found{}, fmt.Errorf("snapshot %w", err)
	}
	looked = append(looked, path)
	if s3 == nil {
		return Found{}, fmt.Errorf("no snapshot named %s: looked for %s; with --snapshot-s3 kelp looks on S3 too; kelp snapshot ls shows the snapshots", nameOrPath, strings.Join(looked, " and "))
	}
	r, err := openS3(ctx, *s3)
	if err == nil {
		if path, err = d.fetch(ctx, r, nameOrPath); err == nil {
			return Found{Path: path, FetchedFrom: r.location(nameOrPath)}, nil
		}
	}
	looked = append(looked, s3.Location()+"/"+nameOrPath)
	return Found{}, fmt.Errorf("no snapshot named %s: looked for %s: %w", nameOrPath, strings.Join(looked, ", "), err)
}

// Verified checks that the snapshot file at path (from Find) is whole (its
// sha256), of the datastore kind, and, unless force, of this cluster.
func (d Dir) Verified(path, kind string, force bool) error {
	meta, err := d.check(path, kind, force)
	if err != nil {
		return err
	}
	sum, _, err := hashFile(path)
	if err != nil {
		return err
	}
	if sum != meta.SHA256 {
		return fmt.Errorf("snapshot %s is corrupt: its sha256 is %s, its metadata says %s; nothing was changed: restore another snapshot", path, sum, meta.SHA256)
	}
	return nil
}

var errOtherCluster = errors.New("comes from another cluster")

// kubernetesVersion is the Kubernetes this kelp runs; tests replace it.
var kubernetesVersion = version.Kubernetes

// check is what every restore checks before it reads the snapshot file at
// path: that it has valid metadata that the cluster's token authenticates
// (authenticate), is of the datastore kind, and, unless
// force, comes from this cluster, if this data dir has a server CA. A data
// dir without one is a new machine replacing a lost server: its
// certificates come from a backup of the old server's tls directory, or
// are made new. The content is checked against the sha256 as it is read.
func (d Dir) check(path, kind string, force bool) (*Metadata, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("snapshot %w: kelp snapshot ls shows the snapshots", err)
	}
	meta, err := readSidecar(path, filepath.Base(path), fi.Size())
	if err != nil {
		return nil, fmt.Errorf("snapshot %s is incomplete or not a kelp snapshot (%v) and cannot be restored; nothing was changed: pick another one", path, err)
	}
	keys, err := d.keys()
	if err != nil {
		return nil, err
	}
	if err := authenticate(meta, path, false, keys); err != nil {
		return nil, err
	}
	switch {
	case meta.Datastore == kind:
	case meta.Datastore == datastore.KindEtcd:
		return nil, fmt.Errorf("snapshot %s is of embedded etcd: restore it with kelp server --cluster-reset --cluster-reset-restore-path %s, with the server stopped; nothing was changed", path, path)
	default:
		return nil, fmt.Errorf("snapshot %s is of a %s datastore, not %s; nothing was changed", path, meta.Datastore, kind)
	}
	if running := kubernetesVersion(); version.NewerMinor(meta.Kubernetes, running) {
		return nil, fmt.Errorf("snapshot %s holds data of Kubernetes %s (kelp %s), which this kelp's Kubernetes %s may not read: restore it with kelp %s or newer; nothing was changed",
			path, meta.Kubernetes, meta.KelpVersion, running, meta.KelpVersion)
	}
	if force {
		return meta, nil
	}
	hash, err := serverCAHash(d.DataDir)
	if errors.Is(err, fs.ErrNotExist) {
		return meta, nil
	}
	if err != nil {
		return nil, err
	}
	if hash != meta.CAHash {
		return nil, fmt.Errorf("snapshot %s %w (its CA hash is %s, this server's is %s): its certificates and tokens would not match this data dir; nothing was changed", path, errOtherCluster, meta.CAHash, hash)
	}
	return meta, nil
}
