package fleet

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/layout"
)

// testController is a controller on fakes, with the nodes n1 (a server)
// and n2 of Kubernetes v1.36.3, and the Upgrades ups in its cache.
func testController(t *testing.T, ups ...*Upgrade) (*controller, func(name string) *Upgrade) {
	dataDir := t.TempDir()
	nodes := []runtime.Object{}
	for _, name := range []string{"n1", "n2"} {
		nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "v1.36.3"}}})
	}
	nodes = append(nodes, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "n1.node-password.kelp", Namespace: "kube-system", Labels: map[string]string{"kelp.io/node-password": "n1", "kelp.io/server-node": "true"}}})
	client := fake.NewClientset(nodes...)
	var objs []runtime.Object
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for _, u := range ups {
		obj, err := toUnstructured(u)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, obj)
		if err := store.Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{Resource: Kind + "List"}, objs...)
	c := &controller{cfg: Config{DataDir: dataDir, StageDir: t.TempDir(), Self: "n1"}, client: client, dynamic: dyn, store: store, workers: map[string]bool{}}
	get := func(name string) *Upgrade {
		obj, err := dyn.Resource(Resource).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		u, err := fromUnstructured(obj)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	return c, get
}

func newUpgrade(name string, age time.Duration, spec Spec) *Upgrade {
	return &Upgrade{
		TypeMeta:   metav1.TypeMeta{APIVersion: Group + "/" + Version, Kind: Kind},
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Now().Add(-age).Truncate(time.Second))},
		Spec:       spec,
	}
}

func readyMessage(u *Upgrade) (string, string) {
	cond := meta.FindStatusCondition(u.Status.Conditions, conditionReady)
	if cond == nil {
		return "", ""
	}
	return cond.Reason, cond.Message
}

func TestControllerRefuses(t *testing.T) {
	older := "#!/bin/sh\nprintf 'kelp v0.1.0 (old)\\nkubernetes v1.35.0\\n'\n"
	for _, tc := range []struct {
		name string
		spec Spec
		want string
	}{
		{"older minor", Spec{SHA256: sum(older), Path: "kelp-older"}, "older minor than v1.36.3"},
		{"source not answering", Spec{SHA256: sum(newKelp), URL: "http://127.0.0.1:1/kelp", AllowHTTP: true}, "check that this node reaches it"},
		{"checksum mismatch", Spec{SHA256: sum("other"), Path: "kelp-new"}, "not spec.sha256"},
		{"bad spec", Spec{SHA256: sum(newKelp)}, "give the new kelp's spec.url"},
		{"plain http", Spec{SHA256: sum(newKelp), URL: "http://127.0.0.1:1/kelp"}, "allowHTTP: true"},
	} {
		c, get := testController(t, newUpgrade("up", 0, tc.spec))
		upgrades := layout.Agent(c.cfg.DataDir).Upgrades
		mkdir(t, upgrades)
		write(t, filepath.Join(upgrades, "kelp-older"), older)
		write(t, filepath.Join(upgrades, "kelp-new"), newKelp)
		if err := c.sync(context.Background()); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		u := get("up")
		reason, msg := readyMessage(u)
		if u.Status.Phase != PhaseFailed || reason != "Refused" || !strings.Contains(msg, tc.want) || !strings.Contains(msg, "no node was touched") {
			t.Errorf("%s: %s, %s: %q; want Failed, Refused, with %q", tc.name, u.Status.Phase, reason, msg, tc.want)
		}
		if len(u.Status.Nodes) != 0 {
			t.Errorf("%s: nodes planned: %+v", tc.name, u.Status.Nodes)
		}
	}
}

// A second Upgrade waits for the first; the first is planned servers
// first.
func TestControllerOneAtATime(t *testing.T) {
	spec := Spec{SHA256: sum(newKelp), Path: "kelp-new"}
	c, get := testController(t, newUpgrade("second", time.Minute, spec), newUpgrade("first", time.Hour, spec))
	upgrades := layout.Agent(c.cfg.DataDir).Upgrades
	mkdir(t, upgrades)
	write(t, filepath.Join(upgrades, "kelp-new"), newKelp)
	if err := c.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	first, second := get("first"), get("second")
	if first.Status.Phase != PhaseUpgrading || len(first.Status.Nodes) != 2 || first.Status.Nodes[0].Name != "n1" || !first.Status.Nodes[0].Server || first.Status.Target != "v9.9.9 (test) (Kubernetes v1.36.3)" {
		t.Errorf("first: %+v", first.Status)
	}
	if reason, msg := readyMessage(second); second.Status.Phase != PhasePending || reason != "Waiting" || !strings.Contains(msg, "waits for Upgrade first") {
		t.Errorf("second: %s, %s: %s; want it Pending, waiting for first", second.Status.Phase, reason, msg)
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
