package server_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// migratedWorkload is what TestHA moves from SQLite to etcd and back: a
// CRD and its object, a Secret (encrypted), and a Deployment on server-1
// with a local-path volume.
const migratedWorkload = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.test.kelp.io}
spec:
  group: test.kelp.io
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: v1
kind: Secret
metadata: {name: migrated}
stringData: {password: migrated-s3cret}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: migrated}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Mi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: migrated}
spec:
  replicas: 1
  selector: {matchLabels: {app: migrated}}
  template:
    metadata: {labels: {app: migrated}}
    spec:
      nodeSelector: {kubernetes.io/hostname: server-1}
      terminationGracePeriodSeconds: 0
      containers:
      - name: web
        image: ` + testcluster.TestImage + `
        imagePullPolicy: IfNotPresent
        args: [serve]
        volumeMounts: [{name: data, mountPath: /data}]
      volumes:
      - name: data
        persistentVolumeClaim: {claimName: migrated}
`

const migratedWidget = `
apiVersion: test.kelp.io/v1
kind: Widget
metadata: {name: migrated}
spec: {size: 3, colour: green}
`

// applyMigratedWorkload applies migratedWorkload on n and waits for its pod.
func applyMigratedWorkload(t *testing.T, n *testcluster.Node) {
	t.Helper()
	waitServiceAccount(t, n.Client(), "default")
	apply(t, n, migratedWorkload)
	testcluster.Eventually(t, "the Widget CRD established", func() (bool, error) {
		_, err := n.Kubectl("wait", "--for=condition=Established", "crd/widgets.test.kelp.io", "--timeout=5s")
		return err == nil, nil
	})
	apply(t, n, migratedWidget)
	rolloutStatus(t, n, "deployment/migrated", 2*startTimeout)
}

// migratedPod is the migrated Deployment's pod.
func migratedPod(t *testing.T, c kubernetes.Interface) corev1.Pod {
	t.Helper()
	pods, err := c.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=migrated"})
	if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
		t.Fatalf("the migrated Deployment's pod: %v, %v", pods, err)
	}
	return pods.Items[0]
}

// notRestarted fails unless pod is the same pod as before, its container
// never restarted.
func notRestarted(t *testing.T, before, pod corev1.Pod) {
	t.Helper()
	was, is := before.Status.ContainerStatuses[0], pod.Status.ContainerStatuses[0]
	if pod.UID != before.UID || is.RestartCount != 0 || is.State.Running == nil || was.State.Running == nil || !is.State.Running.StartedAt.Equal(&was.State.Running.StartedAt) {
		t.Errorf("the migrated pod restarted: before %s %+v, after %s %+v", before.UID, was, pod.UID, is)
	}
}

// readySince returns since when the node name is Ready.
func readySince(t *testing.T, c kubernetes.Interface, name string) time.Time {
	t.Helper()
	node, err := c.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
			return cond.LastTransitionTime.Time
		}
	}
	t.Fatalf("node %s is not Ready: %+v", name, node.Status.Conditions)
	return time.Time{}
}

// migratedDump is what a datastore migration must carry over unchanged:
// the default namespace's objects of the kinds users write and the CRD,
// as the API returns them, every field but resource versions and status.
func migratedDump(t *testing.T, n *testcluster.Node) string {
	t.Helper()
	var items []string
	for _, what := range [][]string{
		{"-n", "default", "secrets,configmaps,deployments,services,persistentvolumeclaims,widgets"},
		{"crd", "widgets.test.kelp.io"},
	} {
		var list struct {
			Items []map[string]any `json:"items"`
		}
		out := kubectl(t, n, append(append([]string{"get"}, what...), "-o", "json")...)
		if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) == 0 {
			// One object comes alone, not in a list.
			var item map[string]any
			if err := json.Unmarshal([]byte(out), &item); err != nil {
				t.Fatalf("kubectl get %v: %v\n%s", what, err, out)
			}
			list.Items = []map[string]any{item}
		}
		for _, item := range list.Items {
			delete(item, "status")
			meta, _ := item["metadata"].(map[string]any)
			delete(meta, "resourceVersion")
			delete(meta, "managedFields")
			b, err := json.Marshal(item)
			if err != nil {
				t.Fatal(err)
			}
			items = append(items, string(b))
		}
	}
	slices.Sort(items)
	return strings.Join(items, "\n")
}

// sameDump fails when a migration changed what migratedDump shows.
func sameDump(t *testing.T, when, before, after string) {
	t.Helper()
	if before == after {
		return
	}
	b, a := strings.Split(before, "\n"), strings.Split(after, "\n")
	for _, line := range b {
		if !slices.Contains(a, line) {
			t.Errorf("%s: lost or changed\n%s", when, line)
		}
	}
	for _, line := range a {
		if !slices.Contains(b, line) {
			t.Errorf("%s: new or changed\n%s", when, line)
		}
	}
}

// secretEncrypted fails unless the migrated Secret is stored encrypted in
// n's datastore.
func secretEncrypted(t *testing.T, n *testcluster.Node) {
	t.Helper()
	out, err := n.RunKelp(time.Minute, "etcdctl", "--data-dir", n.DataDir, "get", "/registry/secrets/default/migrated", "--print-value-only")
	if err != nil || !strings.HasPrefix(strings.TrimSpace(out), "k8s:enc:") || strings.Contains(out, "migrated-s3cret") {
		t.Errorf("the migrated Secret in the datastore: %v\n%.200q", err, out)
	}
}
