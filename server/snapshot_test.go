package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
// by its name while the configured S3 is down.
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
	n.Start(args...)
	n.WaitReady(startTimeout)
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
	name := ""
	for _, f := range strings.Fields(out) {
		if strings.HasPrefix(f, "before-delete-") {
			name = f
		}
	}
	if err := c.CoreV1().Namespaces().Delete(ctx, "precious", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "namespace precious gone", func() (bool, error) {
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
	} else {
		t.Logf("stopped in %s", n.Stop())
		restoreEtcd(t, n, name, args)
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
