package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	stdlog "log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/rclone/gofakes3"
	"github.com/rclone/gofakes3/s3mem"
	"github.com/robfig/cron/v3"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/layout"
)

const (
	testBucket    = "snapshots"
	testAccessKey = "kelp-test"
	testSecretKey = "kelp-test-secret"
)

// fakeS3 is an S3-compatible server on 127.0.0.1, in this process, that
// checks request signatures against one key pair.
type fakeS3 struct {
	cfg     config.S3
	backend *s3mem.Backend
}

func newFakeS3(t *testing.T) fakeS3 {
	t.Helper()
	backend := s3mem.New()
	if err := backend.CreateBucket(context.Background(), testBucket); err != nil {
		t.Fatal(err)
	}
	faker := gofakes3.New(backend, gofakes3.WithV4Auth(map[string]string{testAccessKey: testSecretKey}))
	srv := httptest.NewServer(faker.Server())
	t.Cleanup(srv.Close)
	return fakeS3{
		backend: backend,
		cfg: config.S3{
			Endpoint:  strings.TrimPrefix(srv.URL, "http://"),
			Bucket:    testBucket,
			Folder:    "clusters/a",
			Region:    "us-east-1",
			AccessKey: testAccessKey,
			SecretKey: testSecretKey,
			Insecure:  true,
			Timeout:   30 * time.Second,
		},
	}
}

// args are the kelp snapshot flags that select this S3 folder.
func (f fakeS3) args() []string {
	return []string{"--snapshot-s3", "--snapshot-s3-endpoint", f.cfg.Endpoint, "--snapshot-s3-bucket", f.cfg.Bucket,
		"--snapshot-s3-folder", f.cfg.Folder, "--snapshot-s3-region", f.cfg.Region, "--snapshot-s3-insecure",
		"--snapshot-s3-access-key", f.cfg.AccessKey, "--snapshot-s3-secret-key", f.cfg.SecretKey}
}

// keys returns the object keys in the bucket, sorted.
func (f fakeS3) keys(t *testing.T) []string {
	t.Helper()
	list, err := f.backend.ListBucket(context.Background(), testBucket, nil, gofakes3.ListBucketPage{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, c := range list.Contents {
		keys = append(keys, c.Key)
	}
	slices.Sort(keys)
	return keys
}

// put writes an object as another S3 client would.
func (f fakeS3) put(t *testing.T, key string, data []byte) {
	t.Helper()
	r := openTestS3(t, f.cfg)
	if _, err := r.client.PutObject(context.Background(), testBucket, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
}

func openTestS3(t *testing.T, cfg config.S3) *remote {
	t.Helper()
	r, err := openS3(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runCommand runs kelp snapshot with args and returns what it printed.
func runCommand(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := &cli.App{Name: "kelp", Writer: &out, ErrWriter: io.Discard, Commands: []*cli.Command{Command()}}
	err := app.Run(append([]string{"kelp", "snapshot"}, args...))
	return out.String(), err
}

// sqliteDataDir returns the data dir of a stopped server with a SQLite
// datastore holding one key; Save copies it all the same.
func sqliteDataDir(t *testing.T) string {
	t.Helper()
	dataDir, _ := newServerDir(t)
	ds := start(t, datastore.Config{DataDir: dataDir})
	put(t, client(t, ds.Backend()), "/registry/test/a", "one")
	stop(t, ds)
	return dataDir
}

func names(list []Snapshot) []string {
	var ns []string
	for _, s := range list {
		ns = append(ns, s.Name)
	}
	slices.Sort(ns)
	return ns
}

func localNames(t *testing.T, d Dir) []string {
	t.Helper()
	list, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	return names(list)
}

// s3Names returns the names of the complete snapshots on S3.
func s3Names(t *testing.T, r *remote) []string {
	t.Helper()
	list, err := r.list(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return names(slices.DeleteFunc(list, func(s Snapshot) bool { return s.Meta == nil }))
}

func TestCommandWithS3(t *testing.T) {
	s3 := newFakeS3(t)
	dataDir := sqliteDataDir(t)
	snapDir := t.TempDir()
	common := slices.Concat([]string{"--data-dir", dataDir, "--snapshot-dir", snapDir}, s3.args())
	d := Dir{DataDir: dataDir, Path: snapDir}
	r := openTestS3(t, s3.cfg)

	var saved []string
	for _, name := range []string{"one", "two", "three"} {
		out, err := runCommand(t, slices.Concat([]string{"save"}, common, []string{"--name", name})...)
		if err != nil {
			t.Fatalf("save --snapshot-s3: %v", err)
		}
		if !strings.Contains(out, "uploaded s3://snapshots/clusters/a/"+name+"-") {
			t.Errorf("save printed %q, want the S3 location", out)
		}
		list, err := d.List()
		if err != nil {
			t.Fatal(err)
		}
		saved = append(saved, list[0].Name)
	}
	if got := s3Names(t, r); !slices.Equal(got, localNames(t, d)) || len(got) != 3 {
		t.Fatalf("on S3 %v, local %v: want the same 3", got, localNames(t, d))
	}
	for _, name := range saved {
		if !slices.Contains(s3.keys(t), "clusters/a/"+name+".json") {
			t.Errorf("no sidecar object for %s: %v", name, s3.keys(t))
		}
	}

	out, err := runCommand(t, slices.Concat([]string{"ls"}, common)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range saved {
		for _, loc := range []string{"file://" + filepath.Join(snapDir, name), "s3://snapshots/clusters/a/" + name} {
			if !strings.Contains(out, loc+"\n") {
				t.Errorf("ls does not show %s:\n%s", loc, out)
			}
		}
	}
	if out, err := runCommand(t, "ls", "--data-dir", dataDir, "--snapshot-dir", snapDir); err != nil || strings.Contains(out, "s3://") {
		t.Errorf("ls without --snapshot-s3 (%v):\n%s", err, out)
	}

	out, err = runCommand(t, slices.Concat([]string{"prune"}, common, []string{"--retention", "2"})...)
	if err != nil {
		t.Fatalf("prune: %v", err)
	}
	want := []string{saved[1], saved[2]}
	slices.Sort(want)
	if got := localNames(t, d); !slices.Equal(got, want) {
		t.Errorf("after prune local = %v, want %v", got, want)
	}
	if got := s3Names(t, r); !slices.Equal(got, want) {
		t.Errorf("after prune on S3 = %v, want %v", got, want)
	}
	if !strings.Contains(out, "deleted s3://snapshots/clusters/a/"+saved[0]) || !strings.Contains(out, "deleted file://") {
		t.Errorf("prune printed %q", out)
	}

	if _, err := runCommand(t, slices.Concat([]string{"delete"}, common, []string{saved[1]})...); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if got, s3got := localNames(t, d), s3Names(t, r); !slices.Equal(got, saved[2:]) || !slices.Equal(s3got, saved[2:]) {
		t.Errorf("after delete local = %v, S3 = %v, want %v", got, s3got, saved[2:])
	}
	if _, err := runCommand(t, slices.Concat([]string{"delete"}, common, []string{saved[2], saved[1]})...); err == nil || !strings.Contains(err.Error(), "no snapshot named "+saved[1]) {
		t.Errorf("delete of a missing snapshot: %v", err)
	}
	if len(localNames(t, d)) != 1 || len(s3Names(t, r)) != 1 {
		t.Error("a delete that named a missing snapshot deleted the others")
	}

	// A snapshot only on S3 is deleted there.
	if err := d.Delete(saved[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := runCommand(t, slices.Concat([]string{"delete"}, common, []string{saved[2]})...); err != nil {
		t.Fatalf("delete of a snapshot only on S3: %v", err)
	}
	if keys := s3.keys(t); len(keys) != 0 {
		t.Errorf("left on S3: %v", keys)
	}
}

// uploaded returns a stopped SQLite server's data dir with a snapshot
// that is also on S3.
func uploaded(t *testing.T, s3 fakeS3) (Dir, Metadata) {
	t.Helper()
	d, m := savedSQLite(t)
	if err := openTestS3(t, s3.cfg).upload(context.Background(), filepath.Join(d.path(), m.Name), m); err != nil {
		t.Fatalf("upload: %v", err)
	}
	return d, m
}

func TestFetch(t *testing.T) {
	s3 := newFakeS3(t)
	_, m := uploaded(t, s3)

	// A new machine after a disaster: the user gives the token.
	into := Dir{DataDir: t.TempDir(), Path: filepath.Join(t.TempDir(), "snapshots"), Token: testTokenSecret}
	found, err := into.Find(context.Background(), m.Name, &s3.cfg)
	if err != nil {
		t.Fatalf("Find of a snapshot only on S3: %v", err)
	}
	path := found.Path
	if found.FetchedFrom != "s3://snapshots/clusters/a/"+m.Name {
		t.Errorf("Find fetched from %q", found.FetchedFrom)
	}
	if path != filepath.Join(into.path(), m.Name) || sha256File(t, path) != m.SHA256 {
		t.Errorf("fetched %s, want %s with sha256 %s", path, m.Name, m.SHA256)
	}
	list, err := into.List()
	if err != nil || len(list) != 1 || list[0].Meta == nil || list[0].Meta.SHA256 != m.SHA256 {
		t.Errorf("after Fetch the directory lists %+v (%v), want the complete snapshot", list, err)
	}
	if again, err := into.Find(context.Background(), m.Name, &s3.cfg); err != nil || again.Path != path || again.FetchedFrom != "" {
		t.Errorf("Find of a snapshot that is there already: %+v, %v", again, err)
	}

	if _, err := into.Find(context.Background(), "kelp-snapshot-x-20260101T000000Z", &s3.cfg); err == nil || !strings.Contains(err.Error(), "no snapshot named") {
		t.Errorf("Fetch of a missing snapshot: %v", err)
	}

	key := s3.cfg.Folder + "/" + m.Name
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		content []byte
	}{
		{"same size, other content", append(slices.Clone(data[:len(data)-1]), data[len(data)-1]^0xff)},
		{"cut short", data[:len(data)/2]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s3.put(t, key, tc.content)
			empty := Dir{DataDir: t.TempDir(), Path: t.TempDir(), Token: testTokenSecret}
			_, err := empty.Find(context.Background(), m.Name, &s3.cfg)
			if err == nil || !strings.Contains(err.Error(), "is corrupt") || !strings.Contains(err.Error(), "nothing was written") {
				t.Fatalf("Fetch of a corrupt object: %v", err)
			}
			if entries, _ := os.ReadDir(empty.path()); len(entries) != 0 {
				t.Errorf("a failed Fetch left %v", entries)
			}
		})
	}
}

func TestRestoreFromS3(t *testing.T) {
	s3 := newFakeS3(t)
	d, m := uploaded(t, s3)
	if err := d.Delete(m.Name); err != nil {
		t.Fatal(err)
	}
	common := []string{"--data-dir", d.DataDir, "--snapshot-dir", d.Path}
	if _, err := runCommand(t, slices.Concat([]string{"restore"}, common, []string{m.Name})...); err == nil {
		t.Fatal("restore of a snapshot only on S3 without --snapshot-s3 succeeded")
	}
	out, err := runCommand(t, slices.Concat([]string{"restore"}, common, s3.args(), []string{m.Name})...)
	if err != nil {
		t.Fatalf("restore --snapshot-s3: %v", err)
	}
	if !strings.Contains(out, "fetched s3://snapshots/clusters/a/"+m.Name) || !strings.Contains(out, "restored "+m.Name) {
		t.Errorf("restore printed %q", out)
	}
	if got := sha256File(t, datastore.SQLitePath(d.DataDir)); got != m.SHA256 {
		t.Errorf("restored database sha256 %s, want %s", got, m.SHA256)
	}
}

func TestS3WrongCredentials(t *testing.T) {
	s3 := newFakeS3(t)
	d, m := uploaded(t, s3)
	before := s3.keys(t)

	bad := s3.cfg
	bad.SecretKey = "wrong"
	_, err := openS3(context.Background(), bad)
	if err == nil || !strings.Contains(err.Error(), s3.cfg.Endpoint) || !strings.Contains(err.Error(), "check --snapshot-s3-access-key and --snapshot-s3-secret-key") {
		t.Fatalf("wrong secret key: %v", err)
	}
	elsewhere := Dir{DataDir: d.DataDir, Path: t.TempDir()}
	if _, err := elsewhere.Find(context.Background(), m.Name, &bad); err == nil || !strings.Contains(err.Error(), "refused the credentials") {
		t.Errorf("Find on S3 with a wrong secret key: %v", err)
	}

	args := []string{"--data-dir", d.DataDir, "--snapshot-dir", d.Path, "--snapshot-s3", "--snapshot-s3-endpoint", bad.Endpoint,
		"--snapshot-s3-bucket", bad.Bucket, "--snapshot-s3-folder", bad.Folder, "--snapshot-s3-region", bad.Region,
		"--snapshot-s3-insecure", "--snapshot-s3-access-key", bad.AccessKey, "--snapshot-s3-secret-key", bad.SecretKey}
	for _, cmd := range [][]string{
		slices.Concat([]string{"prune"}, args, []string{"--retention", "1"}),
		slices.Concat([]string{"delete"}, args, []string{m.Name}),
		slices.Concat([]string{"ls"}, args),
	} {
		if _, err := runCommand(t, cmd...); err == nil || !strings.Contains(err.Error(), "refused the credentials") {
			t.Errorf("%s with a wrong secret key: %v", cmd[0], err)
		}
	}
	if got := localNames(t, d); !slices.Equal(got, []string{m.Name}) {
		t.Errorf("local snapshots after S3 errors: %v", got)
	}
	if got := s3.keys(t); !slices.Equal(got, before) {
		t.Errorf("S3 objects after S3 errors: %v, before %v", got, before)
	}
}

func TestS3MissingBucket(t *testing.T) {
	s3 := newFakeS3(t)
	cfg := s3.cfg
	cfg.Bucket = "absent"
	_, err := openS3(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "bucket absent does not exist at "+cfg.Endpoint) || !strings.Contains(err.Error(), "create it") {
		t.Errorf("missing bucket: %v", err)
	}
}

func TestS3EndpointCA(t *testing.T) {
	backend := s3mem.New()
	if err := backend.CreateBucket(context.Background(), testBucket); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(gofakes3.New(backend).Server())
	// The refused handshake is what the test wants, not news.
	srv.Config.ErrorLog = stdlog.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	cfg := config.S3{
		Endpoint:  strings.TrimPrefix(srv.URL, "https://"),
		Bucket:    testBucket,
		AccessKey: testAccessKey,
		SecretKey: testSecretKey,
		Timeout:   30 * time.Second,
	}
	if _, err := openS3(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "--snapshot-s3-endpoint-ca") {
		t.Errorf("endpoint with an unknown CA: %v", err)
	}
	cfg.EndpointCA = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(cfg.EndpointCA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	// No region: the client asks the endpoint for the bucket's.
	if _, err := openS3(context.Background(), cfg); err != nil {
		t.Errorf("endpoint with --snapshot-s3-endpoint-ca: %v", err)
	}
}

func TestScheduleSavesUploadsAndPrunes(t *testing.T) {
	s3 := newFakeS3(t)
	dataDir, _ := newServerDir(t)
	ds := start(t, datastore.Config{DataDir: dataDir})
	put(t, client(t, ds.Backend()), "/registry/test/a", "one")
	snapDir := t.TempDir()
	every, err := cron.ParseStandard("@every 1s")
	if err != nil {
		t.Fatal(err)
	}
	cfg := ScheduleConfig{
		Snapshots: config.Snapshots{
			Schedule:      every,
			Retention:     2,
			SnapshotStore: config.SnapshotStore{Dir: snapDir, S3: &s3.cfg},
		},
		DataDir: dataDir,
		Node:    "node-1",
	}
	// What the schedule of node-1 must not prune: a snapshot saved by
	// hand, node-1-b's in the shared S3 folder, and files not kelp's.
	old := time.Now().Add(-time.Hour)
	fakeSnapshot(t, snapDir, "manual-node-1-20260101T000000Z", old)
	writeOld(t, filepath.Join(snapDir, "notes.txt"), "mine")
	other := Metadata{Name: "kelp-snapshot-node-1-b-20260101T000000Z", Datastore: datastore.KindSQLite, SHA256: "unchecked", Created: old}
	otherSidecar, err := json.Marshal(other)
	if err != nil {
		t.Fatal(err)
	}
	s3.put(t, "clusters/a/"+other.Name, nil)
	s3.put(t, "clusters/a/"+other.Name+".json", otherSidecar)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Schedule(ctx, cfg) }()

	d := Dir{DataDir: dataDir, Path: snapDir}
	r := openTestS3(t, s3.cfg)
	scheduled := func(ns []string) []string {
		var out []string
		for _, n := range ns {
			if savedAs(n, "kelp-snapshot-node-1") {
				out = append(out, n)
			}
		}
		return out
	}
	// Wait until the first scheduled snapshot is pruned in both places,
	// which takes three runs.
	var first string
	deadline := time.Now().Add(60 * time.Second)
	for {
		local := scheduled(localNames(t, d))
		if first == "" && len(local) > 0 {
			first = local[0]
		}
		onS3 := scheduled(s3Names(t, r))
		if first != "" && !slices.Contains(local, first) && !slices.Contains(onS3, first) && len(local) == 2 && slices.Equal(local, onS3) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the schedule did not take and prune snapshots: first %q, local %v, S3 %v", first, local, onS3)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Schedule returned %v after its context ended, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Schedule did not return after its context ended")
	}

	local := localNames(t, d)
	for _, n := range []string{"manual-node-1-20260101T000000Z", "notes.txt"} {
		if !slices.Contains(local, n) {
			t.Errorf("the schedule pruned %s: %v", n, local)
		}
	}
	if !slices.Contains(s3Names(t, r), other.Name) {
		t.Errorf("the schedule of node-1 pruned node-1-b's snapshot on S3")
	}
	list, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	complete := 0
	for _, s := range list {
		if savedAs(s.Name, "kelp-snapshot-node-1") && s.Meta != nil {
			complete++
		}
	}
	if complete != 2 {
		t.Errorf("%d complete scheduled snapshots left, want 2: %v", complete, names(list))
	}
}

// TestScheduleRunKeepsLocalWhileS3Fails checks that a run whose upload
// fails keeps its snapshot and prunes nothing.
func TestScheduleRunKeepsLocalWhileS3Fails(t *testing.T) {
	s3 := newFakeS3(t)
	dataDir := sqliteDataDir(t)
	snapDir := t.TempDir()
	fakeSnapshot(t, snapDir, "kelp-snapshot-node-1-20260101T000000Z", time.Now().Add(-time.Hour))
	bad := s3.cfg
	bad.SecretKey = "wrong"
	events := fake.NewClientset()
	cfg := ScheduleConfig{
		Snapshots: config.Snapshots{Retention: 1, SnapshotStore: config.SnapshotStore{Dir: snapDir, S3: &bad}},
		DataDir:   dataDir,
		Node:      "node-1",
		Events:    events,
	}
	err := cfg.run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "refused the credentials") || !strings.Contains(err.Error(), "no snapshot is pruned") {
		t.Fatalf("run with a wrong secret key: %v", err)
	}
	// The failure shows on the Node, naming the endpoint, not the secret.
	evs, err := events.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(evs.Items) != 1 {
		t.Fatalf("events: %v, %v; want one", evs, err)
	}
	ev := evs.Items[0]
	if ev.InvolvedObject.Kind != "Node" || ev.InvolvedObject.Name != "node-1" || ev.Type != corev1.EventTypeWarning || ev.Reason != ReasonUploadFailed ||
		!strings.Contains(ev.Message, bad.Endpoint) || !strings.Contains(ev.Message, "is kept in "+snapDir) || strings.Contains(ev.Message, bad.SecretKey) || strings.Contains(ev.Message, testAccessKey) {
		t.Errorf("event on %s %s: %s %s: %q", ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Type, ev.Reason, ev.Message)
	}
	d := Dir{DataDir: dataDir, Path: snapDir}
	list, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Meta == nil || list[1].Meta == nil {
		t.Errorf("after a failed upload the directory lists %v, want the new snapshot and the old one", names(list))
	}
}

func TestSaveIntoFullDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dataDir, _ := newServerDir(t)
	ds := start(t, datastore.Config{DataDir: dataDir})
	cli := client(t, ds.Backend())
	put(t, cli, "/registry/test/a", "one")

	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,mode=0700"); err != nil {
		t.Skipf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	d := Dir{DataDir: dataDir, Path: dir}
	first, err := d.Save(context.Background(), "small")
	if err != nil {
		t.Fatalf("Save into an empty 1 MiB directory: %v", err)
	}
	for i := range 32 {
		put(t, cli, fmt.Sprintf("/registry/test/big-%d", i), strings.Repeat(string(rune('a'+i%26)), 64<<10))
	}

	_, err = d.Save(context.Background(), "big")
	if err == nil || !strings.Contains(err.Error(), "is full") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Save of a 2 MiB datastore into a 1 MiB directory: %v", err)
	}
	list, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != first.Name || list[0].Meta == nil {
		t.Errorf("after a failed save the directory lists %v, want only %s", names(list), first.Name)
	}
	if got := sha256File(t, filepath.Join(dir, first.Name)); got != first.SHA256 {
		t.Errorf("the earlier snapshot changed: sha256 %s, want %s", got, first.SHA256)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Errorf("a failed save left files behind: %v", entries)
	}
}

// s3DownArgs are kelp snapshot flags for S3 at the closed port of down.
func s3DownArgs(down config.S3) []string {
	return []string{"--snapshot-s3", "--snapshot-s3-endpoint", down.Endpoint, "--snapshot-s3-bucket", down.Bucket,
		"--snapshot-s3-folder", down.Folder, "--snapshot-s3-region", down.Region, "--snapshot-s3-insecure",
		"--snapshot-s3-access-key", down.AccessKey, "--snapshot-s3-secret-key", down.SecretKey}
}

// TestSaveKeepsLocalWhileS3Down checks that kelp snapshot save with S3
// unreachable keeps its snapshot locally and fails naming the endpoint,
// and that the next save with S3 back uploads it too.
func TestSaveKeepsLocalWhileS3Down(t *testing.T) {
	dataDir := sqliteDataDir(t)
	snapDir := t.TempDir()
	d := Dir{DataDir: dataDir, Path: snapDir, Node: "node-1"}
	common := []string{"--data-dir", dataDir, "--snapshot-dir", snapDir, "--node-name", "node-1"}
	down := closedS3(t)
	events := fakeAPIServer(t, dataDir)

	out, err := runCommand(t, slices.Concat([]string{"save"}, common, s3DownArgs(down), []string{"--name", "while-down"})...)
	if err == nil || !strings.Contains(err.Error(), down.Endpoint) || !strings.Contains(err.Error(), "is kept") {
		t.Fatalf("save with S3 down: %v, want an error that names %s and keeps the snapshot\n%s", err, down.Endpoint, out)
	}
	if got := events(); len(got) != 1 || !strings.Contains(got[0], ReasonUploadFailed) || !strings.Contains(got[0], "node-1") || !strings.Contains(got[0], down.Endpoint) || strings.Contains(got[0], down.SecretKey) {
		t.Errorf("events recorded: %q; want one on node-1 that names %s", got, down.Endpoint)
	}
	list, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Meta == nil || !savedAs(list[0].Name, "while-down-node-1") || list[0].Meta.Node != "node-1" {
		t.Fatalf("after a save with S3 down the directory lists %v, want one complete snapshot of node-1", names(list))
	}
	first := list[0].Name
	if !strings.Contains(out, "saved "+first) {
		t.Errorf("save printed %q", out)
	}

	// S3 is back: the next save uploads its snapshot and the one S3 missed.
	s3 := newFakeS3(t)
	time.Sleep(time.Second) // names go by the second
	out, err = runCommand(t, slices.Concat([]string{"save"}, common, s3.args(), []string{"--name", "back"})...)
	if err != nil {
		t.Fatalf("save with S3 back: %v\n%s", err, out)
	}
	if got, want := s3Names(t, openTestS3(t, s3.cfg)), localNames(t, d); !slices.Equal(got, want) || len(got) != 2 {
		t.Errorf("on S3 %v, local %v: want both snapshots in both places", got, want)
	}
	if !strings.Contains(out, "uploaded s3://snapshots/clusters/a/"+first) {
		t.Errorf("save printed %q, want the upload of %s", out, first)
	}
}

// fakeAPIServer answers the server's admin.kubeconfig in dataDir with
// an apiserver that takes Events; it returns the bodies of those it took
// (protobuf or JSON: either holds the strings as they are).
func fakeAPIServer(t *testing.T, dataDir string) func() []string {
	t.Helper()
	var mu sync.Mutex
	var took []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/api/v1/namespaces/default/events" || err != nil {
			http.Error(w, "not an event", http.StatusNotFound)
			return
		}
		mu.Lock()
		took = append(took, string(body))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"kind":"Event","apiVersion":"v1","metadata":{"name":"e","namespace":"default"}}`))
	}))
	t.Cleanup(srv.Close)
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters["kelp"] = &clientcmdapi.Cluster{Server: srv.URL}
	kubeconfig.AuthInfos["admin"] = &clientcmdapi.AuthInfo{}
	kubeconfig.Contexts["kelp"] = &clientcmdapi.Context{Cluster: "kelp", AuthInfo: "admin"}
	kubeconfig.CurrentContext = "kelp"
	if err := clientcmd.WriteToFile(*kubeconfig, layout.Server(dataDir).AdminKubeconfig); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(took)
	}
}

// TestScheduleUploadsWhatS3Missed checks that a scheduled run with S3
// down keeps its snapshot, and the next run with S3 back uploads it.
func TestScheduleUploadsWhatS3Missed(t *testing.T) {
	dataDir := sqliteDataDir(t)
	snapDir := t.TempDir()
	down := closedS3(t)
	cfg := ScheduleConfig{
		Snapshots: config.Snapshots{Retention: 5, SnapshotStore: config.SnapshotStore{Dir: snapDir, S3: &down}},
		DataDir:   dataDir,
		Node:      "node-1",
	}
	err := cfg.run(context.Background())
	if err == nil || !strings.Contains(err.Error(), down.Endpoint) {
		t.Fatalf("run with S3 down: %v, want an error that names %s", err, down.Endpoint)
	}
	d := Dir{DataDir: dataDir, Path: snapDir}
	if got := localNames(t, d); len(got) != 1 {
		t.Fatalf("after a run with S3 down the directory lists %v, want its snapshot", got)
	}
	s3 := newFakeS3(t)
	cfg.Snapshots.S3 = &s3.cfg
	time.Sleep(time.Second)
	if err := cfg.run(context.Background()); err != nil {
		t.Fatalf("run with S3 back: %v", err)
	}
	if got, want := s3Names(t, openTestS3(t, s3.cfg)), localNames(t, d); !slices.Equal(got, want) || len(got) != 2 {
		t.Errorf("on S3 %v, local %v: want both snapshots in both places", got, want)
	}
}

// TestPruneOwnNodeOnly checks that kelp snapshot prune on one of two
// servers sharing an S3 folder removes only its own old snapshots, and
// that --all-nodes prunes them all together.
func TestPruneOwnNodeOnly(t *testing.T) {
	s3 := newFakeS3(t)
	dataDir := sqliteDataDir(t)
	snapDir := t.TempDir()
	r := openTestS3(t, s3.cfg)
	base := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	var mine, theirs []string
	// Three snapshots each of node-1 and node-1-b, alternating in time,
	// in the shared folder; node-1's are local too.
	for i := range 6 {
		node := []string{"node-1", "node-1-b"}[i%2]
		created := base.Add(time.Duration(i) * time.Minute)
		name := "kelp-snapshot-" + node + "-" + created.Format(timeFormat)
		data := []byte("snapshot " + name)
		sum := sha256.Sum256(data)
		meta := Metadata{Name: name, Datastore: datastore.KindSQLite, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data)), Created: created, Node: node}
		b, err := json.Marshal(meta)
		if err != nil {
			t.Fatal(err)
		}
		s3.put(t, s3.cfg.Folder+"/"+name, data)
		s3.put(t, s3.cfg.Folder+"/"+name+".json", b)
		if node == "node-1" {
			mine = append(mine, name)
			fakeSnapshot(t, snapDir, name, created)
			editSidecar(t, Dir{Path: snapDir}, name, func(m *Metadata) { m.Node = node })
		} else {
			theirs = append(theirs, name)
		}
	}
	common := slices.Concat([]string{"prune", "--data-dir", dataDir, "--snapshot-dir", snapDir, "--node-name", "node-1", "--retention", "1"}, s3.args())
	if out, err := runCommand(t, common...); err != nil {
		t.Fatalf("prune: %v\n%s", err, out)
	}
	want := slices.Sorted(slices.Values(append([]string{mine[2]}, theirs...)))
	if got := s3Names(t, r); !slices.Equal(got, want) {
		t.Errorf("after prune on node-1, S3 holds %v, want node-1's newest and all of node-1-b's: %v", got, want)
	}
	if got := localNames(t, Dir{Path: snapDir}); !slices.Equal(got, mine[2:]) {
		t.Errorf("after prune on node-1, the directory holds %v, want %v", got, mine[2:])
	}

	if out, err := runCommand(t, append(common, "--all-nodes")...); err != nil {
		t.Fatalf("prune --all-nodes: %v\n%s", err, out)
	}
	if got := s3Names(t, r); !slices.Equal(got, theirs[2:]) {
		t.Errorf("after prune --all-nodes --retention 1, S3 holds %v, want only the newest of all, %v", got, theirs[2:])
	}
}

// TestSaveOffsite checks the snapshot taken before an upgrade: with S3
// down it is kept locally and nothing fails; with S3 up it is copied there.
func TestSaveOffsite(t *testing.T) {
	dataDir := sqliteDataDir(t)
	d := Dir{DataDir: dataDir, Path: t.TempDir(), Node: "node-1"}
	down := closedS3(t)
	m, err := d.SaveOffsite(context.Background(), UpgradeName("v0.4.0", "v0.5.0"), &down)
	if err != nil {
		t.Fatalf("SaveOffsite with S3 down: %v", err)
	}
	if !savedAs(m.Name, "pre-upgrade-v0.4.0-v0.5.0-node-1") {
		t.Errorf("named %s", m.Name)
	}
	if got := localNames(t, d); !slices.Equal(got, []string{m.Name}) {
		t.Errorf("kept locally: %v, want %s", got, m.Name)
	}
	s3 := newFakeS3(t)
	time.Sleep(time.Second) // names go by the second
	m2, err := d.SaveOffsite(context.Background(), UpgradeName("v0.5.0", "v0.6.0"), &s3.cfg)
	if err != nil {
		t.Fatalf("SaveOffsite with S3 up: %v", err)
	}
	// The one S3 missed goes up with it.
	if got := s3Names(t, openTestS3(t, s3.cfg)); !slices.Contains(got, m2.Name) || !slices.Contains(got, m.Name) {
		t.Errorf("on S3: %v, want %s and %s", got, m.Name, m2.Name)
	}
}
