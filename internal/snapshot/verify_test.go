package snapshot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kelp-dev/kelp/internal/datastore"
)

// Verified is what --cluster-reset-restore-path checks before it changes
// anything: each bad input gets its own clear refusal.
func TestVerified(t *testing.T) {
	d, m := savedSQLite(t)
	path := filepath.Join(d.path(), m.Name)
	if got, err := d.Verified(m.Name, datastore.KindSQLite, false); err != nil || got != path {
		t.Fatalf("Verified(%s) = %s, %v; want %s", m.Name, got, err, path)
	}
	if got, err := d.Verified(path, datastore.KindSQLite, false); err != nil || got != path {
		t.Fatalf("Verified by path = %s, %v", got, err)
	}
	for _, tc := range []struct {
		name, nameOrPath, kind, want string
		damage                       func()
	}{
		{"missing", "no-such-snapshot", datastore.KindSQLite, "kelp snapshot ls shows", nil},
		{"missing path", "/nonexistent/snap", datastore.KindSQLite, "no such file", nil},
		{"other kind", m.Name, datastore.KindEtcd, "is of a sqlite datastore, not etcd", nil},
		{"other cluster", m.Name, datastore.KindSQLite, "comes from another cluster", func() {
			editSidecar(t, d, m.Name, func(m *Metadata) { m.CAHash = strings.Repeat("0", 64) })
		}},
		{"corrupt", m.Name, datastore.KindSQLite, "is corrupt", func() {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0xff
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated", m.Name, datastore.KindSQLite, "no valid metadata", func() {
			if err := os.Truncate(path, m.Size/2); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.damage != nil {
				tc.damage()
			}
			if _, err := d.Verified(tc.nameOrPath, tc.kind, false); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Verified: %v, want an error with %q", err, tc.want)
			}
		})
	}
}
