package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/testlog"
	"github.com/kelp-dev/kelp/internal/token"
)

// A sidecar changed by someone without the token is refused, and nothing
// is changed.
func TestRestoreRefusesForgedSidecar(t *testing.T) {
	d, m := savedSQLite(t)
	forgeSidecar(t, d, m.Name, func(m *Metadata) { m.Node = "elsewhere" })
	before := dbFiles(t, d)
	_, err := d.Restore(filepath.Join(d.path(), m.Name), restoreForced)
	if err == nil || !strings.Contains(err.Error(), "altered or forged") || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("Restore of a forged sidecar: %v", err)
	}
	unchanged(t, d, before)
}

// Someone who may write to the bucket replaces a snapshot and its
// sidecar with a consistent pair of their own: the restore does not
// download it, with or without a MAC, and says why.
func TestFetchRefusesUnauthenticatedSidecar(t *testing.T) {
	s3 := newFakeS3(t)
	_, m := uploaded(t, s3)
	evil := []byte("SQLite format 3\x00 the attacker's cluster")
	sum := sha256.Sum256(evil)
	forged := m
	forged.SHA256, forged.Size = hex.EncodeToString(sum[:]), int64(len(evil))
	signedElsewhere := forged
	keyFrom("the attacker's own token secret").sign(&signedElsewhere)
	unsigned := forged
	unsigned.MAC, unsigned.MACKeyID = "", ""
	for _, tc := range []struct {
		name string
		meta Metadata
		want string
	}{
		{"the old MAC", forged, "altered or forged"},
		{"a MAC of another key", signedElsewhere, "another server token"},
		{"no MAC", unsigned, "not authenticated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s3.put(t, s3.cfg.Folder+"/"+m.Name, evil)
			b, err := json.Marshal(tc.meta)
			if err != nil {
				t.Fatal(err)
			}
			s3.put(t, s3.cfg.Folder+"/"+m.Name+sidecarExt, b)
			into := Dir{DataDir: t.TempDir(), Path: t.TempDir(), Token: testTokenSecret}
			_, err = into.Find(context.Background(), m.Name, &s3.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Find: %v, want a refusal that says %q", err, tc.want)
			}
			if entries, _ := os.ReadDir(into.path()); len(entries) != 0 {
				t.Errorf("a refused fetch left %v", entries)
			}
		})
	}
}

// On a new machine the restore needs the cluster's token to check a
// snapshot from S3, and takes it with --token-file.
func TestRestoreFromS3OnANewMachine(t *testing.T) {
	s3 := newFakeS3(t)
	_, m := uploaded(t, s3)
	dataDir := t.TempDir()
	common := slices.Concat([]string{"restore", "--data-dir", dataDir}, s3.args())
	_, err := runCommand(t, append(common, m.Name)...)
	if err == nil || !strings.Contains(err.Error(), "give the token with --token-file") {
		t.Fatalf("restore on a new machine without the token: %v", err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("KELP1"+m.CAHash+"::server:"+testTokenSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := runCommand(t, slices.Concat(common, []string{"--token-file", tokenFile, m.Name})...); err != nil {
		t.Fatalf("restore on a new machine with --token-file: %v", err)
	}
	if got := sha256File(t, datastore.SQLitePath(dataDir)); got != m.SHA256 {
		t.Errorf("restored database sha256 %s, want %s", got, m.SHA256)
	}
}

// After a `kelp token rotate`, a snapshot saved before is checked with
// the old token, given; without it the refusal says what happened.
func TestRestoreAfterTokenRotation(t *testing.T) {
	d, m := savedSQLite(t)
	if _, err := token.Ensure(layout.Server(d.DataDir).Token, token.ServerUser, "fedcba9876543210fedcba9876543210", m.CAHash); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(d.path(), m.Name)
	if err := d.Verified(path, datastore.KindSQLite, false); err == nil || !strings.Contains(err.Error(), "kelp token rotate") || !strings.Contains(err.Error(), "--token-file") {
		t.Fatalf("Verified with the rotated token only: %v", err)
	}
	d.Token = testTokenSecret
	if err := d.Verified(path, datastore.KindSQLite, false); err != nil {
		t.Fatalf("Verified with the old token given: %v", err)
	}
}

// A local snapshot of an older kelp, without a MAC, is restored with a
// warning: only root writes the snapshot directory.
func TestRestoreUnauthenticatedLocalSnapshot(t *testing.T) {
	d, m := savedSQLite(t)
	forgeSidecar(t, d, m.Name, func(m *Metadata) { m.MAC, m.MACKeyID = "", "" })
	hook := testlog.Capture(t)
	if _, err := d.Restore(filepath.Join(d.path(), m.Name), restoreSQLite); err != nil {
		t.Fatalf("Restore of an older kelp's snapshot: %v", err)
	}
	warned := false
	for _, e := range hook.AllEntries() {
		warned = warned || e.Level == logrus.WarnLevel && strings.Contains(e.Message, "not authenticated")
	}
	if !warned {
		t.Error("no warning that the snapshot is not authenticated")
	}
}
