package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kelp-dev/kelp/internal/localstorage"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// statefulWorkload is a StatefulSet of one pod, not root, with a volume
// of the default StorageClass.
const statefulWorkload = `
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 0
      securityContext: {runAsUser: 1000, runAsGroup: 1000}
      containers:
      - name: db
        image: ` + testcluster.TestImage + `
        imagePullPolicy: IfNotPresent
        args: [serve]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 64Mi}}
`

// TestLocalStorage runs `kelp server` with its node, whose storage path
// is at first blocked by a file: the StatefulSet's claim stays Pending
// with a Warning that names the path. Once the file is gone, the claim
// gets a volume on the node; a pod that is not root writes to it, and the
// pod made again finds what it wrote; the volume deleted by hand keeps
// its data while its claim is bound, and deleting the claim then removes
// the volume and its directory.
func TestLocalStorage(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.Agent = true
	n.AddImage(testcluster.BuildTestImage(t, testcluster.TestImage))
	blocker := filepath.Join(n.Dir, "disk")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	storage := filepath.Join(blocker, "volumes")
	n.Start("--default-local-storage-path", storage)
	n.WaitReady(startTimeout)
	c := n.Client()
	waitNodeReady(t, c)
	ctx := context.Background()
	class, err := c.StorageV1().StorageClasses().Get(ctx, "local-path", metav1.GetOptions{})
	if err != nil || class.Annotations["storageclass.kubernetes.io/is-default-class"] != "true" || class.Provisioner != localstorage.Provisioner ||
		class.VolumeBindingMode == nil || *class.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Fatalf("the server's StorageClass local-path: %+v, %v", class, err)
	}
	waitServiceAccount(t, c, "default")
	apply(t, n, statefulWorkload)
	const claimName = "data-db-0"

	testcluster.Eventually(t, "a warning that names the storage path", func() (bool, error) {
		events, err := c.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + claimName + ",reason=ProvisioningFailed"})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, storage) && strings.Contains(e.Message, "--default-local-storage-path") {
				return true, nil
			}
		}
		return false, nil
	})
	claim, err := c.CoreV1().PersistentVolumeClaims("default").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Phase != corev1.ClaimPending || claim.Spec.StorageClassName == nil || *claim.Spec.StorageClassName != "local-path" {
		t.Errorf("claim %s is %s, of class %v: want Pending, of the default class local-path", claimName, claim.Status.Phase, claim.Spec.StorageClassName)
	}

	// The provisioner tries again, after its backoff.
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	rolloutStatus(t, n, "statefulset/db", 150*time.Second)
	claim, err = c.CoreV1().PersistentVolumeClaims("default").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	volume, err := c.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the claim's volume %q: %v", claim.Spec.VolumeName, err)
	}
	dir := filepath.Join(storage, "pvc-"+string(claim.UID)+"_default_"+claimName)
	if volume.Spec.Local == nil || volume.Spec.Local.Path != dir || volume.Labels[localstorage.NodeLabel] != n.Name ||
		volume.Annotations["pv.kubernetes.io/provisioned-by"] != localstorage.Provisioner ||
		volume.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || volume.Spec.Capacity.Storage().String() != "64Mi" {
		t.Errorf("volume %s: %+v %+v, want a local volume at %s on %s", volume.Name, volume.ObjectMeta, volume.Spec, dir, n.Name)
	}
	checkMode(t, dir, 0o777)

	pod, err := c.CoreV1().Pods("default").Get(ctx, "db-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubectl(t, n, "exec", "db-0", "--", "/testapp", "write", "/data/greeting", "hello from "+string(pod.UID))
	if data, err := os.ReadFile(filepath.Join(dir, "greeting")); err != nil || string(data) != "hello from "+string(pod.UID) {
		t.Errorf("the file the pod wrote, on the node: %q, %v", data, err)
	}

	kubectl(t, n, "delete", "pod", "db-0")
	testcluster.Eventually(t, "the pod made again", func() (bool, error) {
		p, err := c.CoreV1().Pods("default").Get(ctx, "db-0", metav1.GetOptions{})
		return err == nil && p.UID != pod.UID && podReady(p), nil
	})
	if out := strings.TrimSpace(kubectl(t, n, "exec", "db-0", "--", "/testapp", "cat", "/data/greeting")); out != "hello from "+string(pod.UID) {
		t.Errorf("the pod made again reads %q from its volume", out)
	}

	// The volume deleted by hand first, as an admin cleaning up does: it
	// waits for its claim, and then its directory goes with it.
	kubectl(t, n, "delete", "pv", volume.Name, "--wait=false")
	if out := strings.TrimSpace(kubectl(t, n, "exec", "db-0", "--", "/testapp", "cat", "/data/greeting")); out != "hello from "+string(pod.UID) {
		t.Errorf("a volume deleted while its claim is bound lost its data: the pod reads %q", out)
	}
	kubectl(t, n, "delete", "statefulset", "db")
	kubectl(t, n, "delete", "pvc", claimName, "--wait=false")
	testcluster.EventuallyWithin(t, 2*time.Minute, "volume "+volume.Name+" deleted", func() (bool, error) {
		_, err := c.CoreV1().PersistentVolumes().Get(ctx, volume.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the volume's directory %s is still there: %v", dir, err)
	}
	for _, resource := range []string{"persistentvolume", "storageclasses"} {
		if n.Logged(`cannot list resource "` + resource) {
			t.Errorf("the node's controller was refused %s", resource)
		}
	}
}
