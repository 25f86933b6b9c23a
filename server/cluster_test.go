package server_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kelp-dev/kelp/internal/crd"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

const (
	startTimeout = 2 * time.Minute
	testNS       = "persist"
)

var widgets = schema.GroupVersionResource{Group: "kelp.test", Version: "v1", Resource: "widgets"}

func TestServerSQLite(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	testPersistence(t, n, false)
	checkMode(t, n.Kubeconfig, 0o600)
}

// TestKubectl runs the built-in kubectl as `kelp kubectl` and through a
// link named kubectl, the way users call it.
func TestKubectl(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.Start()
	n.WaitReady(startTimeout)
	link := filepath.Join(n.Dir, "kubectl")
	if err := os.Symlink(testcluster.Binary(t), link); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []*exec.Cmd{
		n.Command(testcluster.Binary(t), "kubectl", "--kubeconfig", n.Kubeconfig, "get", "namespace", "kube-system", "-o", "name"),
		n.Command(link, "--kubeconfig", n.Kubeconfig, "get", "namespace", "kube-system", "-o", "name"),
	} {
		out, err := n.Run(time.Minute, cmd)
		if err != nil || strings.TrimSpace(out) != "namespace/kube-system" {
			t.Errorf("%v: %v\n%s", cmd.Args, err, out)
		}
	}
	out, err := n.Run(time.Minute, n.Command(link, "--kubeconfig", n.Kubeconfig, "get", "namespace", "no-such-namespace"))
	if testcluster.ExitCode(err) != 1 || !strings.Contains(out, "NotFound") && !strings.Contains(out, "not found") {
		t.Errorf("kubectl errors must come through with kubectl's exit code: %v\n%s", err, out)
	}
	n.Stop()
}

func TestServerEmbeddedEtcd(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	testPersistence(t, n, true, "--cluster-init", "--write-kubeconfig-mode", "0644")
	checkMode(t, n.Kubeconfig, 0o644)
}

func TestServerPostgres(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	pg := testcluster.StartPostgres(t, n)
	testPersistence(t, n, true, "--datastore-endpoint", pg.URL("kelp"))

	// A wrong password fails start with a clear error that hides it.
	wrong := strings.Replace(pg.URL("kelp"), pg.Password, "not-the-password", 1)
	out, err := n.RunKelp(time.Minute, n.ServerArgs("--datastore-endpoint", wrong)...)
	if err == nil || !strings.Contains(out, "postgres") || strings.Contains(out, "not-the-password") {
		t.Errorf("wrong password: want an error naming postgres without the password, got %v:\n%s", err, out)
	}
}

// TestStopDuringStart stops the server while the apiserver is starting:
// a requested stop is a clean exit, not a failure, and the next start works.
func TestStopDuringStart(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.Start()
	n.WaitLog("datastore", startTimeout)
	t.Logf("stopped in %s", n.Stop())
	n.Start()
	n.WaitReady(startTimeout)
	n.Stop()
}

// testPersistence starts a server, writes every kind of object a user
// relies on, restarts the server and checks that all of it is still there.
// With elected, the controller-manager and the scheduler hold leader
// leases, which they release as the server stops, so that the restarted
// server takes them over at once.
func testPersistence(t *testing.T, n *testcluster.Node, elected bool, args ...string) {
	n.Start(args...)
	n.WaitReady(startTimeout)
	createObjects(t, n)
	watchSeesChanges(t, n)
	controlPlaneWorks(t, n)
	var holders map[string]string
	var released <-chan map[string]string
	if elected {
		holders = leaseHolders(t, n)
		released = watchLeaderLeases(t, n)
	}
	t.Logf("stopped in %s", n.Stop())
	if elected {
		leasesReleased(t, released)
	}

	n.Start(args...)
	n.WaitReady(startTimeout)
	checkObjects(t, n)
	if elected {
		leadersTakeOver(t, n, holders)
	} else {
		noElections(t, n)
	}
	t.Logf("stopped in %s", n.Stop())
}

// noElections checks that a SQLite server, which no second server can
// join, writes no leader or apiserver-peer leases: on an SD card each
// renewal is a write every 10 s.
func noElections(t *testing.T, n *testcluster.Node) {
	t.Helper()
	leases, err := n.Client().CoordinationV1().Leases("kube-system").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Items {
		if slices.Contains(leaderLeases, l.Name) {
			t.Errorf("lease %s exists: leader election runs on SQLite", l.Name)
		}
	}
}

var leaderLeases = []string{"kube-controller-manager", "kube-scheduler"}

// leaseHolders waits until the controller-manager's and the scheduler's
// leader leases are held and returns who holds them.
func leaseHolders(t *testing.T, n *testcluster.Node) map[string]string {
	t.Helper()
	c := n.Client()
	holders := map[string]string{}
	for _, name := range leaderLeases {
		testcluster.Eventually(t, "lease "+name+" held", func() (bool, error) {
			holders[name] = leaseHolder(c, name)
			return holders[name] != "", nil
		})
	}
	return holders
}

// leaseHolder is the holder of a kube-system lease, "" if none.
func leaseHolder(c kubernetes.Interface, name string) string {
	lease, err := c.CoordinationV1().Leases("kube-system").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// watchLeaderLeases watches the leader leases until the server stops and
// then delivers their last holders.
func watchLeaderLeases(t *testing.T, n *testcluster.Node) <-chan map[string]string {
	t.Helper()
	leases := n.Client().CoordinationV1().Leases("kube-system")
	list, err := leases.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holders := map[string]string{}
	for _, l := range list.Items {
		holders[l.Name] = ptr.Deref(l.Spec.HolderIdentity, "")
	}
	w, err := leases.Watch(context.Background(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	last := make(chan map[string]string, 1)
	go func() {
		for ev := range w.ResultChan() {
			if l, ok := ev.Object.(*coordinationv1.Lease); ok {
				holders[l.Name] = ptr.Deref(l.Spec.HolderIdentity, "")
			}
		}
		last <- holders
	}()
	return last
}

// leasesReleased checks that the controller-manager and the scheduler
// released their leader leases as the server stopped, so that a restarted
// server, or another one, leads at once.
func leasesReleased(t *testing.T, last <-chan map[string]string) {
	t.Helper()
	var holders map[string]string
	select {
	case holders = <-last:
	case <-time.After(time.Minute):
		t.Fatal("the watch of the leader leases did not end with the server")
	}
	for _, name := range leaderLeases {
		if holders[name] != "" {
			t.Errorf("lease %s still held by %s after a clean stop: want it released", name, holders[name])
		}
	}
}

// leadersTakeOver checks that a restarted server's controller-manager and
// scheduler lead well before the previous run's leases would expire: at
// least 10 s before, which a takeover on expiry (then a retry period) never
// is.
func leadersTakeOver(t *testing.T, n *testcluster.Node, before map[string]string) {
	t.Helper()
	c := n.Client()
	deadline := time.Now().Add(time.Minute)
	for _, name := range leaderLeases {
		lease, err := c.CoordinationV1().Leases("kube-system").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s := lease.Spec
		if s.HolderIdentity == nil || *s.HolderIdentity != before[name] || s.RenewTime == nil || s.LeaseDurationSeconds == nil {
			continue // taken over already
		}
		expires := s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second)
		if d := expires.Add(-10 * time.Second); d.Before(deadline) {
			deadline = d
		}
	}
	testcluster.EventuallyWithin(t, time.Until(deadline), fmt.Sprintf("leader leases taken over from the previous run (%v) 10 s before they would expire", before), func() (bool, error) {
		for _, name := range leaderLeases {
			if now := leaseHolder(c, name); now == "" || now == before[name] {
				return false, nil
			}
		}
		return true, nil
	})
}

func createObjects(t *testing.T, n *testcluster.Node) {
	t.Helper()
	ctx := context.Background()
	c := n.Client()
	must(t, "namespace", func() error {
		_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS}}, metav1.CreateOptions{})
		return err
	})
	must(t, "configmap", func() error {
		_, err := c.CoreV1().ConfigMaps(testNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
		return err
	})
	must(t, "secret", func() error {
		_, err := c.CoreV1().Secrets(testNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Data: map[string][]byte{"password": []byte("hunter2")}}, metav1.CreateOptions{})
		return err
	})
	must(t, "deployment", func() error {
		_, err := c.AppsV1().Deployments(testNS).Create(ctx, deployment(), metav1.CreateOptions{})
		return err
	})
	must(t, "role", func() error {
		_, err := c.RbacV1().Roles(testNS).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "reader"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}},
		}, metav1.CreateOptions{})
		return err
	})
	must(t, "rolebinding", func() error {
		_, err := c.RbacV1().RoleBindings(testNS).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "reader"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "reader"},
			Subjects:   []rbacv1.Subject{{Kind: "User", Name: "alice", APIGroup: "rbac.authorization.k8s.io"}},
		}, metav1.CreateOptions{})
		return err
	})
	must(t, "clusterrole", func() error {
		_, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "kelp-test-widgets"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"kelp.test"}, Resources: []string{"widgets"}, Verbs: []string{"*"}}},
		}, metav1.CreateOptions{})
		return err
	})

	ext, err := apiextclient.NewForConfig(n.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	must(t, "crd", func() error {
		_, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, widgetCRD(), metav1.CreateOptions{})
		return err
	})
	if err := crd.WaitEstablished(ctx, ext, "widgets.kelp.test", time.Minute); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(n.RestConfig())
	widget := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kelp.test/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w1"},
		"spec":     map[string]any{"size": int64(3)},
	}}
	// Discovery of a new CRD can lag its Established condition by a moment.
	testcluster.Eventually(t, "custom resource", func() (bool, error) {
		_, err := dyn.Resource(widgets).Namespace(testNS).Create(ctx, widget, metav1.CreateOptions{})
		return err == nil, nil
	})
}

// watchSeesChanges opens a watch, changes the ConfigMap and waits for the
// event.
func watchSeesChanges(t *testing.T, n *testcluster.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := n.Client()
	w, err := c.CoreV1().ConfigMaps(testNS).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=cm"})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()
	cm, err := c.CoreV1().ConfigMaps(testNS).Get(ctx, "cm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["k"] = "v2"
	if _, err := c.CoreV1().ConfigMaps(testNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch closed before the change arrived")
			}
			if got, isCM := ev.Object.(*corev1.ConfigMap); isCM && ev.Type == watch.Modified && got.Data["k"] == "v2" {
				return
			}
		case <-ctx.Done():
			t.Fatal("the watch did not see the change")
		}
	}
}

// controlPlaneWorks checks that the controller-manager and the scheduler
// run: the Deployment gets a ReplicaSet and a Pod, and the scheduler
// reports that no node can take the Pod (the server has none); a Node
// registered by hand gets a pod CIDR out of --cluster-cidr.
func controlPlaneWorks(t *testing.T, n *testcluster.Node) {
	t.Helper()
	ctx := context.Background()
	c := n.Client()
	must(t, "node", func() error {
		_, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "hand-made"}}, metav1.CreateOptions{})
		return err
	})
	testcluster.Eventually(t, "pod CIDR allocated to the node", func() (bool, error) {
		node, err := c.CoreV1().Nodes().Get(ctx, "hand-made", metav1.GetOptions{})
		if err != nil || node.Spec.PodCIDR == "" {
			return false, err
		}
		cidr, err := netip.ParsePrefix(node.Spec.PodCIDR)
		if err != nil || cidr.Bits() != 24 || !netip.MustParsePrefix("10.42.0.0/16").Contains(cidr.Addr()) {
			return false, fmt.Errorf("pod CIDR %q is not a /24 of 10.42.0.0/16", node.Spec.PodCIDR)
		}
		return true, nil
	})
	testcluster.Eventually(t, "pod of the deployment marked unschedulable", func() (bool, error) {
		pods, err := c.CoreV1().Pods(testNS).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil || len(pods.Items) == 0 {
			return false, err
		}
		for _, cond := range pods.Items[0].Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
}

func checkObjects(t *testing.T, n *testcluster.Node) {
	t.Helper()
	ctx := context.Background()
	c := n.Client()
	cm, err := c.CoreV1().ConfigMaps(testNS).Get(ctx, "cm", metav1.GetOptions{})
	if err != nil || cm.Data["k"] != "v2" {
		t.Errorf("configmap after restart: %v %v", cm.Data, err)
	}
	s, err := c.CoreV1().Secrets(testNS).Get(ctx, "s", metav1.GetOptions{})
	if err != nil || string(s.Data["password"]) != "hunter2" {
		t.Errorf("secret after restart: %v", err)
	}
	if _, err := c.AppsV1().Deployments(testNS).Get(ctx, "web", metav1.GetOptions{}); err != nil {
		t.Errorf("deployment after restart: %v", err)
	}
	if _, err := c.RbacV1().RoleBindings(testNS).Get(ctx, "reader", metav1.GetOptions{}); err != nil {
		t.Errorf("rolebinding after restart: %v", err)
	}
	if _, err := c.RbacV1().ClusterRoles().Get(ctx, "kelp-test-widgets", metav1.GetOptions{}); err != nil {
		t.Errorf("clusterrole after restart: %v", err)
	}
	dyn := dynamic.NewForConfigOrDie(n.RestConfig())
	testcluster.Eventually(t, "custom resource after restart", func() (bool, error) {
		w, err := dyn.Resource(widgets).Namespace(testNS).Get(ctx, "w1", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		size, _, _ := unstructured.NestedInt64(w.Object, "spec", "size")
		if size != 3 {
			return false, fmt.Errorf("widget size %d, want 3", size)
		}
		return true, nil
	})
}

func deployment() *appsv1.Deployment {
	labels := map[string]string{"app": "web"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "kelp.test/web:1"}}},
			},
		},
	}
}

func widgetCRD() *apiextv1.CustomResourceDefinition {
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.kelp.test"},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: "kelp.test",
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope: apiextv1.NamespaceScoped,
			Versions: []apiextv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextv1.JSONSchemaProps{"size": {Type: "integer"}}},
					},
				}},
			}},
		},
	}
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != want {
		t.Errorf("%s has mode %v, want %v", path, st.Mode().Perm(), want)
	}
}

func must(t *testing.T, what string, fn func() error) {
	t.Helper()
	if err := fn(); err != nil {
		t.Fatalf("create %s: %v", what, err)
	}
}
