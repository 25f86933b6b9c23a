package snapshot

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
)

// Verified is what --cluster-reset-restore-path checks before it changes
// anything: each bad input gets its own clear refusal.
func TestVerified(t *testing.T) {
	d, m := savedSQLite(t)
	path := filepath.Join(d.path(), m.Name)
	if err := d.Verified(path, datastore.KindSQLite, false); err != nil {
		t.Fatalf("Verified(%s): %v", path, err)
	}
	for _, tc := range []struct {
		name, path, kind, want string
		damage                 func(t *testing.T)
	}{
		{"missing path", "/nonexistent/snap", datastore.KindSQLite, "no such file", nil},
		{"other kind", path, datastore.KindEtcd, "is of a sqlite datastore, not etcd", nil},
		{"other cluster", path, datastore.KindSQLite, "comes from another cluster", func(t *testing.T) {
			editSidecar(t, d, m.Name, func(m *Metadata) { m.CAHash = strings.Repeat("0", 64) })
			t.Cleanup(func() { editSidecar(t, d, m.Name, func(s *Metadata) { s.CAHash = m.CAHash }) })
		}},
		{"corrupt", path, datastore.KindSQLite, "is corrupt", func(t *testing.T) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0xff
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated", path, datastore.KindSQLite, "is incomplete", func(t *testing.T) {
			if err := os.Truncate(path, m.Size/2); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.damage != nil {
				tc.damage(t)
			}
			if err := d.Verified(tc.path, tc.kind, false); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Verified: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// closedS3 is S3 configured at a port on which nothing listens.
func closedS3(t *testing.T) config.S3 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return config.S3{Endpoint: addr, Bucket: testBucket, Folder: "clusters/a", Region: "us-east-1",
		AccessKey: testAccessKey, SecretKey: testSecretKey, Insecure: true, Timeout: 30 * time.Second}
}

// TestFindLocalFirst checks how a restore name resolves: a bare name in
// the snapshot directory is found there without asking S3, which is down;
// a name found nowhere gets an error that names every place looked and
// the S3 endpoint.
func TestFindLocalFirst(t *testing.T) {
	d, m := savedSQLite(t)
	down := closedS3(t)
	path := filepath.Join(d.path(), m.Name)

	found, err := d.Find(context.Background(), m.Name, &down)
	if err != nil || found.Path != path || found.FetchedFrom != "" {
		t.Fatalf("Find(%s) with S3 down = %+v, %v; want the local %s", m.Name, found, err, path)
	}
	if found, err := d.Find(context.Background(), path, &down); err != nil || found.Path != path {
		t.Errorf("Find by path = %+v, %v", found, err)
	}

	const missing = "kelp-snapshot-x-20260101T000000Z"
	_, err = d.Find(context.Background(), missing, &down)
	for _, want := range []string{"./" + missing, filepath.Join(d.path(), missing), "s3://snapshots/clusters/a/" + missing, down.Endpoint} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Find of a missing snapshot with S3 down: %v; want it to name %s", err, want)
		}
	}
	_, err = d.Find(context.Background(), missing, nil)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(d.path(), missing)) || strings.Contains(err.Error(), "s3://") {
		t.Errorf("Find of a missing snapshot without S3: %v", err)
	}
	if _, err := d.Find(context.Background(), "/nonexistent/"+m.Name, &down); err == nil || !strings.Contains(err.Error(), "/nonexistent/"+m.Name) {
		t.Errorf("Find of a missing path: %v", err)
	}
}

// TestRestoreByNameWithS3Down is the reported bug: kelp snapshot restore
// NAME with --snapshot-s3 configured and S3 unreachable restores the local
// snapshot.
func TestRestoreByNameWithS3Down(t *testing.T) {
	d, m := savedSQLite(t)
	down := closedS3(t)
	args := []string{"restore", "--data-dir", d.DataDir, "--snapshot-dir", d.Path, "--snapshot-s3", "--snapshot-s3-endpoint", down.Endpoint,
		"--snapshot-s3-bucket", down.Bucket, "--snapshot-s3-insecure", "--snapshot-s3-access-key", down.AccessKey, "--snapshot-s3-secret-key", down.SecretKey, m.Name}
	start := time.Now()
	out, err := runCommand(t, args...)
	if err != nil {
		t.Fatalf("restore %s with S3 down: %v\n%s", m.Name, err, out)
	}
	t.Logf("restored in %s", time.Since(start))
	if strings.Contains(out, "fetched") || !strings.Contains(out, "restored "+m.Name) {
		t.Errorf("restore printed %q", out)
	}
	if got := sha256File(t, datastore.SQLitePath(d.DataDir)); got != m.SHA256 {
		t.Errorf("restored database sha256 %s, want %s", got, m.SHA256)
	}
	if !slices.Contains(localNames(t, d), m.Name) {
		t.Errorf("the snapshot is gone from %s", d.path())
	}
}

// TestFindSilentS3 checks that an S3 endpoint that accepts connections and
// never answers makes Find of a snapshot that is not local fail within the
// time limit, naming the endpoint, and does not stand in the way of a
// local one.
func TestFindSilentS3(t *testing.T) {
	d, m := savedSQLite(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	silent := closedS3(t)
	silent.Endpoint = l.Addr().String()
	silent.Timeout = 2 * time.Second
	if found, err := d.Find(context.Background(), m.Name, &silent); err != nil || found.FetchedFrom != "" {
		t.Fatalf("Find of a local snapshot with S3 silent: %+v, %v", found, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.Find(context.Background(), "kelp-snapshot-x-20260101T000000Z", &silent)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), silent.Endpoint) || !strings.Contains(err.Error(), "no answer within 2s") {
			t.Errorf("Find on a silent S3: %v, want an error that names %s and the time limit", err, silent.Endpoint)
		}
	case <-time.After(time.Minute):
		t.Fatal("Find on a silent S3 did not return within a minute; its time limit is 2s")
	}
}
