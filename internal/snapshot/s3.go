package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/config"
)

// remote is the S3 folder that holds off-site copies of snapshots. Its
// keys mirror a snapshot directory: <folder>/<name> is the snapshot and
// <folder>/<name>.json its sidecar, the same JSON as on disk, uploaded
// after the snapshot. A snapshot object without a valid sidecar is
// incomplete, as a file is.
type remote struct {
	cfg    config.S3
	client *minio.Client
}

// reachTimeout bounds the first request to the endpoint, which tells
// whether it can be reached at all.
const reachTimeout = 30 * time.Second

// maxSidecar bounds what is read of a sidecar object: a real one is a few
// hundred bytes.
const maxSidecar = 64 << 10

// openS3 connects to the bucket of cfg and checks that it exists and that
// the credentials are accepted, so that a misconfiguration is reported
// before anything is changed.
func openS3(ctx context.Context, cfg config.S3) (*remote, error) {
	tr, err := minio.DefaultTransport(!cfg.Insecure)
	if err != nil {
		return nil, err
	}
	if !cfg.Insecure {
		roots, err := x509.SystemCertPool()
		if err != nil {
			roots = x509.NewCertPool()
		}
		if cfg.EndpointCA != "" {
			pem, err := os.ReadFile(cfg.EndpointCA)
			if err != nil {
				return nil, fmt.Errorf("read --snapshot-s3-endpoint-ca: %w", err)
			}
			if !roots.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--snapshot-s3-endpoint-ca %s holds no PEM certificate", cfg.EndpointCA)
			}
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, InsecureSkipVerify: cfg.SkipSSLVerify, MinVersion: tls.VersionTLS12}
	}
	// Without keys, the credentials of the machine's IAM role are used, as
	// on an EC2 instance with an instance profile.
	creds := credentials.NewIAM("")
	if cfg.AccessKey != "" {
		creds = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, "")
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:        creds,
		Secure:       !cfg.Insecure,
		Region:       cfg.Region,
		Transport:    tr,
		BucketLookup: minio.BucketLookupAuto,
	})
	if err != nil {
		return nil, fmt.Errorf("S3 endpoint %s: %w: check --snapshot-s3-endpoint", cfg.Endpoint, err)
	}
	r := &remote{cfg: cfg, client: client}
	// The answer is a few bytes: an endpoint that has not given it soon is
	// down, however long an upload may take.
	wait := min(cfg.Timeout, reachTimeout)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	ok, err := client.BucketExists(ctx, cfg.Bucket)
	if errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("reach bucket %s at %s: no answer within %s: check --snapshot-s3-endpoint and the network", cfg.Bucket, cfg.Endpoint, wait)
	}
	if err != nil {
		return nil, r.explain("reach bucket "+cfg.Bucket+" at", err)
	}
	if !ok {
		return nil, r.noBucket()
	}
	return r, nil
}

func (r *remote) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.Timeout)
}

func (r *remote) noBucket() error {
	return fmt.Errorf("bucket %s does not exist at %s: create it, or fix --snapshot-s3-bucket or --snapshot-s3-endpoint", r.cfg.Bucket, r.cfg.Endpoint)
}

// explain wraps an error of the S3 client: what failed, at the endpoint,
// and what to check.
func (r *remote) explain(what string, err error) error {
	resp := minio.ToErrorResponse(err)
	var unknownCA x509.UnknownAuthorityError
	var badCert *tls.CertificateVerificationError
	switch {
	case resp.Code == "NoSuchBucket":
		return r.noBucket()
	case resp.Code == "InvalidAccessKeyId" || resp.Code == "SignatureDoesNotMatch" || resp.Code == "AccessDenied" ||
		resp.Code == "InvalidToken" || resp.Code == "ExpiredToken" || resp.StatusCode == 401 || resp.StatusCode == 403:
		return fmt.Errorf("%s %s: the endpoint refused the credentials (%w): check --snapshot-s3-access-key and --snapshot-s3-secret-key, and that they may use bucket %s", what, r.cfg.Endpoint, err, r.cfg.Bucket)
	case errors.As(err, &unknownCA) || errors.As(err, &badCert):
		return fmt.Errorf("%s %s: %w: give the endpoint's CA with --snapshot-s3-endpoint-ca", what, r.cfg.Endpoint, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s %s: no answer within --snapshot-s3-timeout %s: check --snapshot-s3-endpoint and the network", what, r.cfg.Endpoint, r.cfg.Timeout)
	}
	return fmt.Errorf("%s %s: %w", what, r.cfg.Endpoint, err)
}

func (r *remote) key(name string) string {
	if r.cfg.Folder == "" {
		return name
	}
	return r.cfg.Folder + "/" + name
}

// location is the s3:// URL of the named snapshot.
func (r *remote) location(name string) string {
	return r.cfg.Location() + "/" + name
}

// upload copies the snapshot at path, and then its sidecar, to S3.
func (r *remote) upload(ctx context.Context, path string, meta Metadata) error {
	ctx, cancel := r.withTimeout(ctx)
	defer cancel()
	if _, err := r.client.FPutObject(ctx, r.cfg.Bucket, r.key(meta.Name), path, minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
		return r.explain("upload snapshot "+meta.Name+" to", err)
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if _, err := r.client.PutObject(ctx, r.cfg.Bucket, r.key(meta.Name+sidecarExt), bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{ContentType: "application/json"}); err != nil {
		return r.explain("upload the metadata of snapshot "+meta.Name+" to", err)
	}
	return nil
}

// list returns the snapshots in the S3 folder as Dir.List does. An S3
// error fails the whole listing rather than making snapshots look
// incomplete, which prune would remove.
func (r *remote) list(ctx context.Context) ([]Snapshot, error) {
	ctx, cancel := r.withTimeout(ctx)
	defer cancel()
	prefix := r.key("")
	objects := map[string]minio.ObjectInfo{}
	for obj := range r.client.ListObjects(ctx, r.cfg.Bucket, minio.ListObjectsOptions{Prefix: prefix}) {
		if obj.Err != nil {
			return nil, r.explain("list snapshots in "+r.cfg.Location()+" at", obj.Err)
		}
		name := strings.TrimPrefix(obj.Key, prefix)
		if name == "" || strings.Contains(name, "/") || strings.HasPrefix(name, ".") {
			continue
		}
		objects[name] = obj
	}
	var list []Snapshot
	for name, obj := range objects {
		if strings.HasSuffix(name, sidecarExt) {
			continue
		}
		s := Snapshot{Name: name, Location: r.location(name), Size: obj.Size, modTime: obj.LastModified}
		if _, ok := objects[name+sidecarExt]; !ok {
			s.Problem = "no metadata"
			list = append(list, s)
			continue
		}
		b, err := r.sidecar(ctx, name)
		if err != nil {
			return nil, err
		}
		if s.Meta, err = parseSidecar(b, name, obj.Size); err != nil {
			s.Problem = err.Error()
		}
		list = append(list, s)
	}
	sortNewestFirst(list)
	return list, nil
}

// sidecar returns the content of the sidecar object of the named snapshot.
func (r *remote) sidecar(ctx context.Context, name string) ([]byte, error) {
	obj, err := r.client.GetObject(ctx, r.cfg.Bucket, r.key(name+sidecarExt), minio.GetObjectOptions{})
	if err == nil {
		defer obj.Close()
		var b []byte
		if b, err = io.ReadAll(io.LimitReader(obj, maxSidecar)); err == nil {
			return b, nil
		}
	}
	if minio.ToErrorResponse(err).Code == "NoSuchKey" {
		return nil, fmt.Errorf("no snapshot named %s in %s: kelp snapshot ls --snapshot-s3 shows them", name, r.cfg.Location())
	}
	return nil, r.explain("read the metadata of snapshot "+name+" from", err)
}

// remove deletes the named snapshots from S3, each sidecar first so that
// an interrupted delete leaves an incomplete snapshot, never a sidecar
// without its snapshot. A name that is not there is no error.
func (r *remote) remove(ctx context.Context, names ...string) error {
	ctx, cancel := r.withTimeout(ctx)
	defer cancel()
	for _, name := range names {
		if err := checkName(name); err != nil {
			return err
		}
		for _, key := range []string{r.key(name + sidecarExt), r.key(name)} {
			if err := r.client.RemoveObject(ctx, r.cfg.Bucket, key, minio.RemoveObjectOptions{}); err != nil {
				return r.explain("delete "+key+" at", err)
			}
		}
	}
	return nil
}

// fetch downloads the named snapshot and its metadata from S3 into the
// snapshot directory, unless the directory has it already, and returns its
// path. Its metadata must be authenticated (authenticate) before anything
// is downloaded, and the download gets its name only once its size and
// sha256 match it: a corrupt or cut-short object leaves nothing behind.
func (d Dir) fetch(ctx context.Context, r *remote, name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	ctx, cancel := r.withTimeout(ctx)
	defer cancel()
	b, err := r.sidecar(ctx, name)
	if err != nil {
		return "", err
	}
	meta, err := parseSidecar(b, name, -1)
	if err != nil {
		return "", fmt.Errorf("snapshot %s is incomplete (%v) and cannot be fetched: pick another one", r.location(name), err)
	}
	keys, err := d.keys()
	if err != nil {
		return "", err
	}
	if err := authenticate(meta, r.location(name), true, keys); err != nil {
		return "", err
	}
	dir := d.path()
	path := filepath.Join(dir, name)
	if sum, _, err := hashFile(path); err == nil {
		if sum != meta.SHA256 {
			return "", fmt.Errorf("snapshot %s differs from its copy %s: move the local file away to fetch the copy", path, r.location(name))
		}
		if _, err := readSidecar(path, name, meta.Size); err != nil {
			if err := atomicfile.Write(path+sidecarExt, b, 0o600); err != nil {
				return "", err
			}
		}
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("create snapshot directory %s: %w", dir, err)
	}
	obj, err := r.client.GetObject(ctx, r.cfg.Bucket, r.key(name), minio.GetObjectOptions{})
	if err != nil {
		return "", r.explain("download snapshot "+name+" from", err)
	}
	defer obj.Close()
	tmp, err := atomicfile.Temp(dir, "."+name+tempInfix, 0o600, func(f *os.File) error {
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(f, h), obj)
		if err != nil {
			// A failed write to the file is an *os.PathError that names
			// it; anything else failed on the S3 side.
			var pathErr *os.PathError
			if errors.As(err, &pathErr) {
				return err
			}
			return r.explain("download snapshot "+name+" from", err)
		}
		if sum := hex.EncodeToString(h.Sum(nil)); n != meta.Size || sum != meta.SHA256 {
			return fmt.Errorf("snapshot %s is corrupt: it is %d bytes with sha256 %s, its metadata says %d bytes with sha256 %s; nothing was written: fetch another snapshot", r.location(name), n, sum, meta.Size, meta.SHA256)
		}
		return nil
	})
	if err != nil {
		return "", fullHint(fmt.Errorf("fetch snapshot %s into %s: %w", name, dir, err), dir)
	}
	if err := publish(tmp, path, *meta); err != nil {
		return "", fullHint(err, dir)
	}
	return path, nil
}

// offsite copies the snapshot just saved, the newest of this node, to S3,
// and with it the snapshots of this node that were saved while S3 could
// not be reached: the complete local ones that are not on S3 and are newer
// than the newest of this node's there. It is called after the local
// snapshot is kept, so that nothing S3 does can prevent or remove it. It
// returns the S3 folder, nil if it could not be opened, and the names it
// uploaded, oldest first.
func (d Dir) offsite(ctx context.Context, cfg config.S3, saved Metadata) (*remote, []string, error) {
	r, err := openS3(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	onS3, err := r.list(ctx)
	if err != nil {
		return r, nil, err
	}
	local, err := d.List()
	if err != nil {
		return r, nil, err
	}
	var uploaded []string
	for _, s := range toUpload(local, onS3, saved) {
		if err := r.upload(ctx, s.Path, *s.Meta); err != nil {
			return r, uploaded, err
		}
		uploaded = append(uploaded, s.Name)
	}
	return r, uploaded, nil
}

// toUpload returns the snapshots of local, sorted newest first, that
// offsite uploads, oldest first: saved, and the complete ones of its node
// that are not on S3 and newer than the newest of that node's there. A
// snapshot deleted on S3 on purpose is older than what is there, and is
// not uploaded again.
func toUpload(local, onS3 []Snapshot, saved Metadata) []Snapshot {
	there := map[string]bool{}
	var newest time.Time
	for _, s := range onS3 {
		there[s.Name] = true
		if s.Meta != nil && ownedBy(s, saved.Node) && s.Meta.Created.After(newest) {
			newest = s.Meta.Created
		}
	}
	var up []Snapshot
	for _, s := range local {
		if s.Meta != nil && (s.Name == saved.Name || !there[s.Name] && ownedBy(s, saved.Node) && s.Meta.Created.After(newest)) {
			up = append(up, s)
		}
	}
	slices.Reverse(up)
	return up
}
