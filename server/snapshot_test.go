package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	stdlog "log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rclone/gofakes3"
	"github.com/rclone/gofakes3/s3mem"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestSnapshotRestore takes a snapshot of a running server with `kelp
// snapshot save`, deletes a namespace full of objects, and brings them back
// while the server is stopped: with `kelp snapshot restore` on SQLite, with
// `kelp server --cluster-reset --cluster-reset-restore-path` on embedded
// etcd, which refuses a corrupt copy first and restores the local snapshot
// by its name while the configured S3 is down; and a snapshot that is only
// on S3, served over TLS in the node's network, by its name: checked with
// --snapshot-s3-endpoint-ca (etcd) or --snapshot-s3-skip-ssl-verify (SQLite).
// The SQLite server also takes scheduled snapshots every 2 s, kept 2 in its
// snapshot directory and 2 on S3.
func TestSnapshotRestore(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		testSnapshotRestore(t, "sqlite")
	})
	t.Run("etcd", func(t *testing.T) {
		t.Parallel()
		testSnapshotRestore(t, "etcd", "--cluster-init")
	})
}

func testSnapshotRestore(t *testing.T, kind string, args ...string) {
	n := testcluster.NewNode(t)
	s3, ca, bucket := offsiteS3(t, n)
	if kind == "sqlite" {
		// Scheduled snapshots every 2 s, kept 2 and copied to S3.
		args = slices.Concat(args, []string{"--snapshot-schedule-cron", "@every 2s", "--snapshot-retention", "2", "--snapshot-s3-endpoint-ca", ca}, s3)
	}
	n.Start(args...)
	n.WaitReady(startTimeout)
	if kind == "sqlite" {
		scheduledSnapshots(t, n, bucket)
	}
	ctx := context.Background()
	c := n.Client()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "precious"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const count = 50
	for i := range count {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)}, Data: map[string]string{"i": fmt.Sprint(i)}}
		if _, err := c.CoreV1().ConfigMaps("precious").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	out, err := n.RunKelp(time.Minute, "snapshot", "save", "--data-dir", n.DataDir, "--name", "before-delete")
	if err != nil {
		t.Fatalf("snapshot save: %v\n%s", err, out)
	}
	out, err = n.RunKelp(time.Minute, "snapshot", "ls", "--data-dir", n.DataDir)
	if err != nil || !strings.Contains(out, "before-delete-") || !strings.Contains(out, kind) {
		t.Fatalf("snapshot ls: %v\n%s", err, out)
	}
	name := snapshotName(out, "before-delete-")
	// A second snapshot goes to S3 over TLS, checked with the endpoint's
	// CA, and then exists only there, as after a lost disk.
	out, err = n.RunKelp(time.Minute, slices.Concat([]string{"snapshot", "save", "--data-dir", n.DataDir, "--name", "offsite"}, s3, []string{"--snapshot-s3-endpoint-ca", ca})...)
	if err != nil || !strings.Contains(out, "uploaded ") {
		t.Fatalf("snapshot save to S3 over TLS: %v\n%s", err, out)
	}
	offsite := snapshotName(out, "offsite-")
	for _, f := range []string{offsite, offsite + ".json"} {
		if err := os.Remove(filepath.Join(n.DataDir, "server", "db", "snapshots", f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.CoreV1().Namespaces().Delete(ctx, "precious", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, "namespace precious gone", func() (bool, error) {
		_, err := c.CoreV1().Namespaces().Get(ctx, "precious", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	if kind == "sqlite" {
		out, err = n.RunKelp(time.Minute, "snapshot", "restore", "--data-dir", n.DataDir, name)
		if err == nil || !strings.Contains(out, "in use by another kelp server") {
			t.Errorf("restore while the server runs must be refused: %v\n%s", err, out)
		}
		t.Logf("stopped in %s", n.Stop())
		out, err = n.RunKelp(time.Minute, "snapshot", "restore", "--data-dir", n.DataDir, name)
		if err != nil {
			t.Fatalf("snapshot restore: %v\n%s", err, out)
		}
		// The one on S3, fetched without checking the endpoint's
		// certificate, as --snapshot-s3-skip-ssl-verify says.
		out, err = n.RunKelp(time.Minute, slices.Concat([]string{"snapshot", "restore", "--data-dir", n.DataDir}, s3, []string{"--snapshot-s3-skip-ssl-verify", offsite})...)
		if err != nil || !strings.Contains(out, "fetched") {
			t.Fatalf("snapshot restore from S3 with --snapshot-s3-skip-ssl-verify: %v\n%s", err, out)
		}
	} else {
		t.Logf("stopped in %s", n.Stop())
		restoreEtcd(t, n, name, args)
		out, err = n.RunKelp(2*time.Minute, n.ServerArgs(slices.Concat(args, s3, []string{"--snapshot-s3-endpoint-ca", ca, "--cluster-reset", "--cluster-reset-restore-path", offsite})...)...)
		if err != nil || !strings.Contains(out, "Fetched the snapshot") || !strings.Contains(out, "Restored the embedded etcd") {
			t.Fatalf("kelp server --cluster-reset-restore-path %s from S3 over TLS: %v\n%s", offsite, err, tail(out))
		}
	}
	n.Start(args...)
	n.WaitReady(startTimeout)
	c = n.Client()
	list, err := c.CoreV1().ConfigMaps("precious").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, cm := range list.Items {
		if strings.HasPrefix(cm.Name, "cm-") {
			got++
		}
	}
	if got != count {
		t.Errorf("after restore: %d of %d ConfigMaps", got, count)
	}
	t.Logf("stopped in %s", n.Stop())
}

// restoreEtcd refuses a corrupt copy of the snapshot, then restores it.
func restoreEtcd(t *testing.T, n *testcluster.Node, name string, args []string) {
	t.Helper()
	dir := filepath.Join(n.DataDir, "server", "db", "snapshots")
	corrupt := filepath.Join(t.TempDir(), name)
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(corrupt, data, 0o600); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(dir, name+".json"), corrupt+".json")
	reset := func(path string) (string, error) {
		return n.RunKelp(2*time.Minute, n.ServerArgs(append(args, "--cluster-reset", "--cluster-reset-restore-path", path)...)...)
	}
	if out, err := reset(corrupt); err == nil || !strings.Contains(out, "is corrupt") {
		t.Errorf("restoring a corrupt snapshot: %v, want a refusal\n%s", err, out)
	}
	// S3 is configured and down, as in a disaster: port 1 of the node's
	// own loopback, where nothing listens. The local snapshot is restored
	// all the same, without S3 being asked.
	s3Down := []string{"--snapshot-s3", "--snapshot-s3-endpoint", "127.0.0.1:1", "--snapshot-s3-bucket", "backups", "--snapshot-s3-insecure",
		"--snapshot-s3-access-key", "kelp", "--snapshot-s3-secret-key", "kelp-secret"}
	start := time.Now()
	out, err := n.RunKelp(2*time.Minute, n.ServerArgs(append(append(args, s3Down...), "--cluster-reset", "--cluster-reset-restore-path", name)...)...)
	if err != nil || !strings.Contains(out, "Restored the embedded etcd") {
		t.Fatalf("kelp server --cluster-reset-restore-path %s with S3 down: %v\n%s", name, err, out)
	}
	t.Logf("restored by name with S3 down in %s", time.Since(start))
}

// scheduledSnapshots waits until n has taken at least four scheduled
// snapshots, and finds two of them in its snapshot directory and two in
// bucket: retention applies on both sides.
func scheduledSnapshots(t *testing.T, n *testcluster.Node, bucket *s3mem.Backend) {
	t.Helper()
	scheduled := func(names []string) int {
		k := 0
		for _, name := range names {
			if strings.HasPrefix(name, "kelp-snapshot-"+n.Name+"-") && !strings.HasSuffix(name, ".json") {
				k++
			}
		}
		return k
	}
	var local, onS3 []string
	testcluster.Eventually(t, "four scheduled snapshots taken, two kept locally and on S3", func() (bool, error) {
		entries, err := os.ReadDir(filepath.Join(n.DataDir, "server", "db", "snapshots"))
		if err != nil {
			return false, nil
		}
		local = local[:0]
		for _, e := range entries {
			local = append(local, e.Name())
		}
		list, err := bucket.ListBucket(context.Background(), "backups", nil, gofakes3.ListBucketPage{})
		if err != nil {
			return false, err
		}
		onS3 = onS3[:0]
		for _, c := range list.Contents {
			onS3 = append(onS3, c.Key)
		}
		return strings.Count(n.Log(), "snapshot taken") >= 4 && strings.Count(n.Log(), "s3://backups/kelp-snapshot-") >= 4 &&
			scheduled(local) == 2 && scheduled(onS3) == 2, nil
	})
}

// snapshotName is the snapshot starting with prefix that out names.
func snapshotName(out, prefix string) string {
	for _, f := range strings.Fields(out) {
		if strings.HasPrefix(f, prefix) && !strings.HasSuffix(f, ".json") {
			return strings.TrimRight(f, ",:")
		}
	}
	return ""
}

// offsiteS3 serves a fake S3 over TLS in n's Outside, with a certificate
// for testcluster.OutsideIP from a CA of the test's, and returns the kelp
// snapshot flags that reach it, the CA's file and the bucket's store.
func offsiteS3(t *testing.T, n *testcluster.Node) (args []string, caFile string, bucket *s3mem.Backend) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test S3 CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "s3"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP(testcluster.OutsideIP)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(n.Dir, "s3-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}

	backend := s3mem.New()
	if err := backend.CreateBucket(context.Background(), "backups"); err != nil {
		t.Fatal(err)
	}
	l, err := n.NewOutside().Listen("tcp", net.JoinHostPort(testcluster.OutsideIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:   gofakes3.New(backend, gofakes3.WithV4Auth(map[string]string{"kelp": "kelp-secret"})).Server(),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}}},
		ErrorLog:  stdlog.New(io.Discard, "", 0),
	}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return []string{"--snapshot-s3", "--snapshot-s3-endpoint", l.Addr().String(), "--snapshot-s3-bucket", "backups",
		"--snapshot-s3-region", "us-east-1", "--snapshot-s3-access-key", "kelp", "--snapshot-s3-secret-key", "kelp-secret"}, caFile, backend
}
