package datastore

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func etcdTestConfig(t *testing.T, dataDir string, tls EtcdTLS) Config {
	ports := freePorts(t, 2)
	return Config{
		DataDir:     dataDir,
		ClusterInit: true,
		Name:        "node-1",
		AdvertiseIP: "127.0.0.1",
		EtcdTLS:     tls,
		clientPort:  ports[0],
		peerPort:    ports[1],
	}
}

func TestEmbeddedEtcdRestartKeepsData(t *testing.T) {
	tls := etcdTestTLS(t)
	dataDir := t.TempDir()
	cfg := etcdTestConfig(t, dataDir, tls)

	d := startReady(t, cfg)
	be := d.Backend()
	if be.Kind != KindEtcd || len(be.Endpoints) != 1 || !strings.HasPrefix(be.Endpoints[0], "https://127.0.0.1:") {
		t.Errorf("Backend = %+v", be)
	}
	if be.CAFile != tls.ServerCA || be.CertFile != tls.Client.Cert || be.KeyFile != tls.Client.Key {
		t.Errorf("Backend TLS files = %+v, want the server CA and the client pair", be)
	}
	put(t, be, "/registry/test/a", "one")
	stopWithin(t, d, 30*time.Second)

	if _, err := os.Stat(filepath.Join(dataDir, "server", "db", "etcd", "member", "wal")); err != nil {
		t.Fatalf("no WAL under the etcd data dir: %v", err)
	}

	d = startReady(t, cfg)
	if got := get(t, d.Backend(), "/registry/test/a"); got != "one" {
		t.Errorf("after restart got %q, want %q", got, "one")
	}
	select {
	case err := <-d.Err():
		t.Errorf("Err: %v", err)
	default:
	}
}

func TestEmbeddedEtcdCorruptDatabaseIsLeftAlone(t *testing.T) {
	tls := etcdTestTLS(t)
	dataDir := t.TempDir()
	cfg := etcdTestConfig(t, dataDir, tls)
	d := startReady(t, cfg)
	put(t, d.Backend(), "/registry/test/a", "one")
	stopWithin(t, d, 30*time.Second)

	db := filepath.Join(dataDir, "server", "db", "etcd", "member", "snap", "db")
	garbage := bytes.Repeat([]byte("not a bbolt page "), 4096)
	if err := os.WriteFile(db, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), cfg)
	if err == nil {
		t.Fatal("Start succeeded on a corrupt etcd database")
	}
	t.Logf("error: %v", err)
	for _, want := range []string{db, "cannot be opened", "restore it from an etcd snapshot"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q", want)
		}
	}
	if after, err := os.ReadFile(db); err != nil || !bytes.Equal(after, garbage) {
		t.Errorf("the etcd database was modified (%v)", err)
	}
}

func TestEmbeddedEtcdRequiresClientCertificate(t *testing.T) {
	tls := etcdTestTLS(t)
	d := startReady(t, etcdTestConfig(t, t.TempDir(), tls))

	noCert := d.Backend()
	noCert.CertFile, noCert.KeyFile = "", ""
	cli, err := newClient(noCert)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "/"); err == nil {
		t.Error("etcd answered a client without a certificate")
	}
}

func TestEmbeddedEtcdMissingCertificate(t *testing.T) {
	tls := etcdTestTLS(t)
	tls.Peer.Key = filepath.Join(t.TempDir(), "missing.key")
	dataDir := t.TempDir()
	_, err := Start(context.Background(), etcdTestConfig(t, dataDir, tls))
	if err == nil || !strings.Contains(err.Error(), "missing.key") {
		t.Fatalf("Start without the peer key: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "server", "db", "etcd", "member")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a failed start left an etcd member behind: %v", err)
	}
}

func TestEmbeddedEtcdPortInUse(t *testing.T) {
	tls := etcdTestTLS(t)
	cfg := etcdTestConfig(t, t.TempDir(), tls)
	startReady(t, cfg)

	other := etcdTestConfig(t, t.TempDir(), tls)
	other.clientPort = cfg.clientPort
	_, err := Start(context.Background(), other)
	if err == nil || !strings.Contains(err.Error(), "using the port") {
		t.Fatalf("Start on a used port: %v", err)
	}
}

// The external-etcd mode hands the endpoint and files through untouched;
// the embedded etcd stands in for a real external cluster.
func TestExternalEtcdPassThrough(t *testing.T) {
	tls := etcdTestTLS(t)
	embedded := startReady(t, etcdTestConfig(t, t.TempDir(), tls))
	put(t, embedded.Backend(), "/registry/test/ext", "yes")

	cfg := Config{
		Endpoint: embedded.Backend().Endpoints[0],
		CAFile:   tls.ServerCA,
		CertFile: tls.Client.Cert,
		KeyFile:  tls.Client.Key,
	}
	d := startReady(t, cfg)
	be := d.Backend()
	if be.Kind != KindExternalEtcd || be.Endpoints[0] != cfg.Endpoint || be.CAFile != cfg.CAFile || be.CertFile != cfg.CertFile || be.KeyFile != cfg.KeyFile {
		t.Errorf("Backend = %+v, want the endpoint and files of %+v", be, cfg)
	}
	if got := get(t, be, "/registry/test/ext"); got != "yes" {
		t.Errorf("got %q through the external endpoint", got)
	}
}

func TestExternalEtcdUnreachableFailsInBoundedTime(t *testing.T) {
	tls := etcdTestTLS(t)
	cfg := Config{
		Endpoint:     "https://127.0.0.1:1",
		CAFile:       tls.ServerCA,
		CertFile:     tls.Client.Cert,
		KeyFile:      tls.Client.Key,
		readyTimeout: 2 * time.Second,
	}
	d, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopWithin(t, d, 10*time.Second) })
	start := time.Now()
	err = d.WaitReady(context.Background())
	if err == nil {
		t.Fatal("WaitReady succeeded on an unreachable etcd")
	}
	t.Logf("error: %v (after %s)", err, time.Since(start))
	if !strings.Contains(err.Error(), "https://127.0.0.1:1") || !strings.Contains(err.Error(), "reachable") {
		t.Errorf("error %q does not name the endpoint or say what to check", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("WaitReady took %s with a 2 s bound", took)
	}
	select {
	case e := <-d.Err():
		if e.Error() != err.Error() {
			t.Errorf("Err delivered %v, WaitReady returned %v", e, err)
		}
	case <-time.After(time.Second):
		t.Error("Err did not deliver the failure")
	}
}

// Switching between SQLite and embedded etcd on one data dir would start an
// empty cluster beside the old one; kelp refuses instead.
func TestDatastoreKindSwitchIsRefused(t *testing.T) {
	tls := etcdTestTLS(t)

	etcdDir := t.TempDir()
	d := startReady(t, etcdTestConfig(t, etcdDir, tls))
	stopWithin(t, d, 30*time.Second)
	_, err := Start(context.Background(), Config{DataDir: etcdDir})
	if err == nil || !strings.Contains(err.Error(), "start with --cluster-init") {
		t.Errorf("SQLite start over an etcd datastore: %v", err)
	}

	sqliteDir := t.TempDir()
	d = startReady(t, Config{DataDir: sqliteDir})
	put(t, d.Backend(), "/registry/test/a", "one")
	stopWithin(t, d, 30*time.Second)
	_, err = Start(context.Background(), etcdTestConfig(t, sqliteDir, tls))
	if err == nil || !strings.Contains(err.Error(), "holds a cluster of its own") {
		t.Errorf("etcd start over a SQLite datastore: %v", err)
	}
}
