package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/token"
)

// newServerDir makes a data dir with a server's PKI, as kelp server does
// before it starts the datastore.

// The targets of the tests' restores: a SQLite datastore, with and
// without --force.
var (
	restoreSQLite = Target{Kind: datastore.KindSQLite}
	restoreForced = Target{Kind: datastore.KindSQLite, Force: true}
)

func newServerDir(t *testing.T) (string, pki.Files) {
	t.Helper()
	dataDir := t.TempDir()
	files, err := pki.Ensure(pki.Config{
		Dir:           layout.Server(dataDir).TLS,
		Hostname:      "node-1",
		IPs:           []net.IP{net.ParseIP("127.0.0.1")},
		ServiceIP:     net.ParseIP("10.43.0.1"),
		ClusterDomain: "cluster.local",
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := token.Ensure(layout.Server(dataDir).Token, token.ServerUser, testTokenSecret, pki.CAHash(readFile(t, files.ServerCA.Cert))); err != nil {
		t.Fatal(err)
	}
	return dataDir, files
}

// testTokenSecret is the secret of the server token of newServerDir.
const testTokenSecret = "0123456789abcdef0123456789abcdef"

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func start(t *testing.T, cfg datastore.Config) *datastore.Datastore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := datastore.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start datastore: %v", err)
	}
	t.Cleanup(func() { stop(t, d) })
	if err := d.WaitReady(ctx); err != nil {
		t.Fatalf("datastore not ready: %v", err)
	}
	return d
}

func stop(t *testing.T, d *datastore.Datastore) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Errorf("stop datastore: %v", err)
	}
}

func client(t *testing.T, be datastore.Backend) *clientv3.Client {
	t.Helper()
	cfg := clientv3.Config{Endpoints: be.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func put(t *testing.T, cli *clientv3.Client, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, key, value); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// get returns the value of key, or "" when there is none.
func get(t *testing.T, cli *clientv3.Client, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func caHashOf(t *testing.T, files pki.Files) string {
	t.Helper()
	b, err := os.ReadFile(files.ServerCA.Cert)
	if err != nil {
		t.Fatal(err)
	}
	return pki.CAHash(b)
}

func checkSidecar(t *testing.T, d Dir, m Metadata, kind, caHash string) {
	t.Helper()
	path := filepath.Join(d.path(), m.Name)
	b, err := os.ReadFile(path + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var onDisk Metadata
	if err := json.Unmarshal(b, &onDisk); err != nil {
		t.Fatalf("sidecar: %v", err)
	}
	if onDisk.Datastore != kind || onDisk.CAHash != caHash || onDisk.SHA256 != sha256File(t, path) || onDisk.Name != m.Name {
		t.Errorf("sidecar = %+v; want kind %s, CA hash %s, sha256 of the file", onDisk, kind, caHash)
	}
	if !strings.HasPrefix(m.Name, "test-") {
		t.Errorf("name %q does not start with --name", m.Name)
	}
}

func TestSQLiteSaveWhileRunningAndRestore(t *testing.T) {
	dataDir, files := newServerDir(t)
	ds := start(t, datastore.Config{DataDir: dataDir})
	cli := client(t, ds.Backend())
	for i := range 100 {
		put(t, cli, "/registry/test/"+string(rune('a'+i%26))+strings.Repeat("x", i), strings.Repeat("v", 200))
	}
	put(t, cli, "/registry/test/kept", "before")

	d := Dir{DataDir: dataDir}
	m, err := d.Save(context.Background(), "test")
	if err != nil {
		t.Fatalf("Save on a running server: %v", err)
	}
	checkSidecar(t, d, m, datastore.KindSQLite, caHashOf(t, files))

	put(t, cli, "/registry/test/kept", "after")
	put(t, cli, "/registry/test/lost", "written after the snapshot")

	if _, err := d.Restore(filepath.Join(d.path(), m.Name), restoreSQLite); err == nil || !strings.Contains(err.Error(), "stop") {
		t.Fatalf("Restore while the datastore runs: %v, want a refusal that says to stop the server", err)
	}
	if got := get(t, cli, "/registry/test/lost"); got == "" {
		t.Fatal("refused restore changed the running datastore")
	}

	stop(t, ds)
	r, err := d.Restore(filepath.Join(d.path(), m.Name), restoreSQLite)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if r.Backup == "" || !strings.Contains(r.Backup, "state.db.before-restore-") {
		t.Errorf("Backup = %q", r.Backup)
	}
	if _, err := os.Stat(r.Backup); err != nil {
		t.Errorf("replaced database not kept: %v", err)
	}
	if got, want := sha256File(t, r.DB), m.SHA256; got != want {
		t.Errorf("restored database sha256 %s, want the snapshot's %s", got, want)
	}

	ds = start(t, datastore.Config{DataDir: dataDir})
	cli = client(t, ds.Backend())
	if got := get(t, cli, "/registry/test/kept"); got != "before" {
		t.Errorf("after restore got %q, want %q", got, "before")
	}
	if got := get(t, cli, "/registry/test/lost"); got != "" {
		t.Errorf("after restore a key written after the snapshot is there: %q", got)
	}
	if got := get(t, cli, "/registry/test/a"); got == "" {
		t.Error("after restore /registry/test/a is missing")
	}
}

// savedSQLite returns a data dir with a stopped SQLite datastore holding one
// key and a snapshot of it.
func savedSQLite(t *testing.T) (Dir, Metadata) {
	t.Helper()
	dataDir, _ := newServerDir(t)
	ds := start(t, datastore.Config{DataDir: dataDir})
	put(t, client(t, ds.Backend()), "/registry/test/a", "one")
	d := Dir{DataDir: dataDir, Path: t.TempDir()}
	m, err := d.Save(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	stop(t, ds)
	return d, m
}

// unchanged fails the test if the db dir differs from before.
func unchanged(t *testing.T, d Dir, before map[string][]byte) {
	t.Helper()
	if after := dbFiles(t, d); !mapsEqual(before, after) {
		t.Errorf("the datastore directory changed: before %v, after %v", keys(before), keys(after))
	}
}

func dbFiles(t *testing.T, d Dir) map[string][]byte {
	t.Helper()
	dir := layout.Server(d.DataDir).DB
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]byte{}
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != "datastore.lock" {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			m[e.Name()] = b
		}
	}
	return m
}

func mapsEqual(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// editSidecar changes a sidecar as its cluster would have written it:
// authenticated with the test token's key.
func editSidecar(t *testing.T, d Dir, name string, edit func(*Metadata)) {
	t.Helper()
	forgeSidecar(t, d, name, func(m *Metadata) {
		edit(m)
		keyFrom(testTokenSecret).sign(m)
	})
}

// forgeSidecar changes a sidecar as someone without the token could.
func forgeSidecar(t *testing.T, d Dir, name string, edit func(*Metadata)) {
	t.Helper()
	path := filepath.Join(d.path(), name+".json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m Metadata
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(&m)
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestRestoreRefusesCorruptSnapshot(t *testing.T) {
	d, m := savedSQLite(t)
	path := filepath.Join(d.path(), m.Name)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff // same size, other content
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	before := dbFiles(t, d)
	_, err = d.Restore(filepath.Join(d.path(), m.Name), restoreForced)
	if err == nil || !strings.Contains(err.Error(), "sha256") || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("Restore of a corrupt snapshot: %v", err)
	}
	unchanged(t, d, before)
}

func TestRestoreRefusesTruncatedSnapshot(t *testing.T) {
	d, m := savedSQLite(t)
	if err := os.Truncate(filepath.Join(d.path(), m.Name), m.Size/2); err != nil {
		t.Fatal(err)
	}
	before := dbFiles(t, d)
	_, err := d.Restore(filepath.Join(d.path(), m.Name), restoreForced)
	if err == nil || !strings.Contains(err.Error(), "incomplete") || !strings.Contains(err.Error(), "metadata says") {
		t.Fatalf("Restore of a truncated snapshot: %v", err)
	}
	unchanged(t, d, before)
}

func TestRestoreRefusesAnotherCluster(t *testing.T) {
	d, m := savedSQLite(t)
	editSidecar(t, d, m.Name, func(m *Metadata) { m.CAHash = strings.Repeat("0", 64) })
	before := dbFiles(t, d)
	_, err := d.Restore(filepath.Join(d.path(), m.Name), restoreSQLite)
	if err == nil || !strings.Contains(err.Error(), "another cluster") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("Restore of another cluster's snapshot: %v", err)
	}
	unchanged(t, d, before)
	if _, err := d.Restore(filepath.Join(d.path(), m.Name), restoreForced); err != nil {
		t.Fatalf("Restore with force: %v", err)
	}
}

// A snapshot of a newer Kubernetes minor is refused, even with --force:
// this apiserver may not read what a newer one stored.
func TestRestoreRefusesNewerKubernetes(t *testing.T) {
	running := kubernetesVersion
	kubernetesVersion = func() string { return "v1.36.3" }
	t.Cleanup(func() { kubernetesVersion = running })
	d, m := savedSQLite(t)
	if m.Kubernetes != "v1.36.3" {
		t.Errorf("the sidecar records Kubernetes %q, want the running v1.36.3", m.Kubernetes)
	}
	editSidecar(t, d, m.Name, func(m *Metadata) { m.Kubernetes = "v1.37.2" })
	before := dbFiles(t, d)
	_, err := d.Restore(filepath.Join(d.path(), m.Name), restoreForced)
	if err == nil || !strings.Contains(err.Error(), "Kubernetes v1.37.2") || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("Restore of a newer Kubernetes minor's snapshot: %v", err)
	}
	unchanged(t, d, before)
	// An older minor, or none recorded (an older kelp's sidecar), restores.
	editSidecar(t, d, m.Name, func(m *Metadata) { m.Kubernetes = "v1.35.9" })
	if _, err := d.Restore(filepath.Join(d.path(), m.Name), restoreSQLite); err != nil {
		t.Errorf("Restore of an older minor's snapshot: %v", err)
	}
}

func TestRestoreRefusesEtcdSnapshot(t *testing.T) {
	d, m := savedSQLite(t)
	editSidecar(t, d, m.Name, func(m *Metadata) { m.Datastore = datastore.KindEtcd })
	before := dbFiles(t, d)
	_, err := d.Restore(filepath.Join(d.path(), m.Name), restoreForced)
	if err == nil || !strings.Contains(err.Error(), "--cluster-reset-restore-path") {
		t.Fatalf("Restore of an etcd snapshot into SQLite: %v", err)
	}
	unchanged(t, d, before)
}

// fakeSnapshot writes a complete snapshot with the given creation time.
func fakeSnapshot(t *testing.T, dir, name string, created time.Time) {
	t.Helper()
	data := []byte("snapshot " + name)
	sum := sha256.Sum256(data)
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(Metadata{Name: name, Datastore: datastore.KindSQLite, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data)), Created: created})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeOld(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
}

func TestListPruneDelete(t *testing.T) {
	dir := t.TempDir()
	d := Dir{DataDir: t.TempDir(), Path: dir}
	base := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	// Names sort the other way round from creation times: prune goes by
	// the metadata.
	for i, name := range []string{"s-node-20261123T120400Z", "s-node-20261123T120300Z", "s-node-20261123T120200Z", "s-node-20261123T120100Z"} {
		fakeSnapshot(t, dir, name, base.Add(time.Duration(i)*time.Minute))
	}
	writeOld(t, filepath.Join(dir, "s-node-20261123T130000Z"), "crashed before its sidecar")
	writeOld(t, filepath.Join(dir, "s-node-20261123T140000Z"), "truncated sidecar")
	writeOld(t, filepath.Join(dir, "s-node-20261123T140000Z.json"), `{"name":"s-node-2026`)
	if err := os.WriteFile(filepath.Join(dir, "s-node-20261123T150000Z"), []byte("a save writing its sidecar now"), 0o600); err != nil {
		t.Fatal(err)
	}
	writeOld(t, filepath.Join(dir, "notes.txt"), "not kelp's")
	writeOld(t, filepath.Join(dir, ".s-node-20261123T160000Z.tmp-123"), "a crashed save's temporary file")

	list, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	var good, incomplete []string
	for _, s := range list {
		if s.Meta != nil {
			good = append(good, s.Name)
		} else {
			incomplete = append(incomplete, s.Name)
		}
	}
	wantGood := []string{"s-node-20261123T120100Z", "s-node-20261123T120200Z", "s-node-20261123T120300Z", "s-node-20261123T120400Z"}
	if !slices.Equal(good, wantGood) {
		t.Errorf("complete snapshots, newest first = %v, want %v", good, wantGood)
	}
	slices.Sort(incomplete)
	if want := []string{"notes.txt", "s-node-20261123T130000Z", "s-node-20261123T140000Z", "s-node-20261123T150000Z"}; !slices.Equal(incomplete, want) {
		t.Errorf("incomplete = %v, want %v", incomplete, want)
	}
	if list[len(list)-1].Meta != nil {
		t.Error("incomplete snapshots are not listed last")
	}

	if _, err := d.prune(0, selection{}); err == nil {
		t.Error("prune(0) succeeded")
	}
	removed, err := d.prune(2, selection{})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	wantRemoved := []string{".s-node-20261123T160000Z.tmp-123", "s-node-20261123T120300Z", "s-node-20261123T120400Z", "s-node-20261123T130000Z", "s-node-20261123T140000Z"}
	if !slices.Equal(removed, wantRemoved) {
		t.Errorf("Prune removed %v, want %v", removed, wantRemoved)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	wantLeft := []string{"notes.txt", "s-node-20261123T120100Z", "s-node-20261123T120100Z.json", "s-node-20261123T120200Z", "s-node-20261123T120200Z.json", "s-node-20261123T150000Z"}
	if !slices.Equal(left, wantLeft) {
		t.Errorf("after Prune(2) the directory holds %v, want %v", left, wantLeft)
	}

	if err := d.Delete("s-node-20261123T120100Z", "notes.txt"); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete("s-node-20261123T120100Z"); err == nil || !strings.Contains(err.Error(), "kelp snapshot ls") {
		t.Errorf("Delete of a missing snapshot: %v", err)
	}
	if err := d.Delete("../etc"); err == nil {
		t.Error("Delete accepted a path")
	}
	list, err = d.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "s-node-20261123T120200Z" {
		t.Errorf("after Delete: %+v", list)
	}
}

func TestRestoreRefusesIncomplete(t *testing.T) {
	d, m := savedSQLite(t)
	sidecar := filepath.Join(d.path(), m.Name+".json")
	b, err := os.ReadFile(sidecar)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sidecar, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	before := dbFiles(t, d)
	if _, err := d.Restore(filepath.Join(d.path(), m.Name), restoreForced); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Fatalf("Restore without valid metadata: %v", err)
	}
	unchanged(t, d, before)
}

func TestSaveRefusesWithoutLocalDatastore(t *testing.T) {
	dataDir, _ := newServerDir(t)
	_, err := Dir{DataDir: dataDir}.Save(context.Background(), "")
	if err == nil || !strings.Contains(err.Error(), "external datastore") {
		t.Fatalf("Save without a datastore: %v", err)
	}
}

func portFree(port string) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func TestEtcdSaveWhileRunning(t *testing.T) {
	// kelp snapshot reaches embedded etcd on its fixed client port.
	if !portFree("2379") || !portFree("2380") {
		t.Skip("ports 2379 and 2380 are in use on this host")
	}
	dataDir, files := newServerDir(t)
	ds := start(t, datastore.Config{
		DataDir:     dataDir,
		ClusterInit: true,
		Name:        "node-1",
		AdvertiseIP: "127.0.0.1",
		EtcdTLS: datastore.EtcdTLS{
			ServerCA: files.EtcdServerCA.Cert,
			Server:   files.EtcdServer,
			PeerCA:   files.EtcdPeerCA.Cert,
			Peer:     files.EtcdPeer,
			Client:   files.EtcdClient,
		},
	})
	cli, err := datastore.LocalEtcdClient(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put(t, cli, "/registry/test/a", "one")

	d := Dir{DataDir: dataDir}
	m, err := d.Save(context.Background(), "test")
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	checkSidecar(t, d, m, datastore.KindEtcd, caHashOf(t, files))
	if m.Size == 0 {
		t.Error("empty etcd snapshot")
	}

	// The snapshot is etcd's backend database, a bbolt file with the keys.
	db, err := bolt.Open(filepath.Join(d.path(), m.Name), 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatalf("open the snapshot as etcd's database: %v", err)
	}
	found := false
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("key"))
		if b == nil {
			return nil
		}
		return b.ForEach(func(_, v []byte) error {
			found = found || bytes.Contains(v, []byte("/registry/test/a"))
			return nil
		})
	})
	db.Close()
	if err != nil || !found {
		t.Errorf("the snapshot does not hold /registry/test/a (%v)", err)
	}

	stop(t, ds)
	if _, err := d.Restore(filepath.Join(d.path(), m.Name), restoreSQLite); err == nil || !strings.Contains(err.Error(), "--cluster-reset-restore-path") {
		t.Errorf("Restore of an etcd snapshot: %v", err)
	}

	if _, err := d.Save(context.Background(), "test"); err == nil || !strings.Contains(err.Error(), "is kelp server running") {
		t.Errorf("Save with etcd stopped: %v", err)
	}
	entries, err := os.ReadDir(d.path())
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Errorf("a failed save left files behind: %v", entries)
	}
}

func TestToPrune(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	snap := func(name string, minutesAgo int, complete bool) Snapshot {
		s := Snapshot{Name: name, modTime: now.Add(-time.Duration(minutesAgo) * time.Minute)}
		if complete {
			s.Meta = &Metadata{Name: name, Created: s.modTime}
		}
		return s
	}
	// Newest first, as List sorts them.
	list := []Snapshot{
		snap("kelp-snapshot-n1-20261123T120000Z", 0, true),
		snap("kelp-snapshot-n1-b-20261123T115900Z", 1, true),
		snap("kelp-snapshot-n1-20261123T115800Z", 2, true),
		snap("kelp-snapshot-n1-20261123T115700Z", 3, true),
		snap("kelp-snapshot-n1-20261123T115600Z", 4, true),
		snap("mine.db", 60, true),
		snap("kelp-snapshot-n1-20261123T110000Z", 60, false),
		snap("kelp-snapshot-n1-20261123T115950Z", 1, false),
	}
	tests := []struct {
		name             string
		retention        int
		base, keep, node string
		want             []string
	}{
		{"all kelp names", 2, "", "", "", []string{"kelp-snapshot-n1-20261123T115800Z", "kelp-snapshot-n1-20261123T115700Z", "kelp-snapshot-n1-20261123T115600Z", "kelp-snapshot-n1-20261123T110000Z"}},
		{"node n1, by name without a node in the metadata", 2, "", "", "n1", []string{"kelp-snapshot-n1-20261123T115700Z", "kelp-snapshot-n1-20261123T115600Z", "kelp-snapshot-n1-20261123T110000Z"}},
		{"node n1-b", 1, "", "", "n1-b", nil},
		{"one node", 2, "kelp-snapshot-n1", "", "", []string{"kelp-snapshot-n1-20261123T115700Z", "kelp-snapshot-n1-20261123T115600Z", "kelp-snapshot-n1-20261123T110000Z"}},
		{"the one just taken is kept even when older", 1, "kelp-snapshot-n1", "kelp-snapshot-n1-20261123T115600Z", "", []string{"kelp-snapshot-n1-20261123T120000Z", "kelp-snapshot-n1-20261123T115800Z", "kelp-snapshot-n1-20261123T115700Z", "kelp-snapshot-n1-20261123T110000Z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := toPrune(list, tt.retention, selection{base: tt.base, keep: tt.keep, node: tt.node}, now); !slices.Equal(got, tt.want) {
				t.Errorf("toPrune = %v, want %v", got, tt.want)
			}
		})
	}
}

// Two restores within one second keep both databases they replaced: the
// second backup does not overwrite the first.
func TestRestoreTwiceKeepsBothBackups(t *testing.T) {
	d, m := savedSQLite(t)
	first, err := d.Restore(filepath.Join(d.path(), m.Name), restoreSQLite)
	if err != nil {
		t.Fatal(err)
	}
	second, err := d.Restore(filepath.Join(d.path(), m.Name), restoreSQLite)
	if err != nil {
		t.Fatal(err)
	}
	if first.Backup == "" || first.Backup == second.Backup {
		t.Fatalf("backups %q and %q: want two", first.Backup, second.Backup)
	}
	for _, b := range []string{first.Backup, second.Backup} {
		if _, err := os.Stat(b); err != nil {
			t.Errorf("backup %s: %v", b, err)
		}
	}
}

func TestUpgradeName(t *testing.T) {
	for _, tc := range []struct{ from, to, want string }{
		{"v0.4.0", "v0.5.0", "pre-upgrade-v0.4.0-v0.5.0"},
		{"v1.36.3", "v1.37.2", "pre-upgrade-v1.36.3-v1.37.2"},
		{"v0.5.0+build/7", "dev", "pre-upgrade-v0.5.0-build-7-dev"},
		{"", "v0.5.0", "pre-upgrade-unknown-v0.5.0"},
		{"../..", "x y", "pre-upgrade-..-..-x-y"},
	} {
		got := UpgradeName(tc.from, tc.to)
		if got != tc.want {
			t.Errorf("UpgradeName(%q, %q) = %q, want %q", tc.from, tc.to, got, tc.want)
		}
		if err := checkName(got); err != nil {
			t.Errorf("UpgradeName(%q, %q): %v", tc.from, tc.to, err)
		}
	}
}
