package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ktypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func pod(name, uid string, mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: ktypes.UID(uid)}, Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	if mod != nil {
		mod(p)
	}
	return p
}

// fakeCluster evicts by deleting, unless a pod is named in blocked, whose
// eviction its PodDisruptionBudget refuses. It records the evictions.
func fakeCluster(t *testing.T, blocked map[string]bool, objs ...runtime.Object) (*fake.Clientset, *[]string) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	c := fake.NewClientset(append(objs, node)...)
	var evictions []string
	c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		name := a.(k8stesting.CreateAction).GetObject().(metav1.Object).GetName()
		evictions = append(evictions, name)
		if blocked[name] {
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		return true, nil, c.Tracker().Delete(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, "default", name)
	})
	return c, &evictions
}

func TestDrain(t *testing.T) {
	yes := true
	ds := func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: &yes}}
	}
	mirror := func(p *corev1.Pod) { p.Annotations = map[string]string{mirrorAnnotation: "x"} }
	done := func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }
	elsewhere := func(p *corev1.Pod) { p.Spec.NodeName = "n2" }
	c, evictions := fakeCluster(t, nil, pod("web", "1", nil), pod("ds", "2", ds), pod("static", "3", mirror), pod("job", "4", done), pod("other", "5", elsewhere))
	// The fake ignores field selectors: keep to n1 as the apiserver does.
	c.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		list := &corev1.PodList{}
		objs, _ := c.Tracker().List(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, "")
		for _, p := range objs.(*corev1.PodList).Items {
			if p.Spec.NodeName == "n1" {
				list.Items = append(list.Items, p)
			}
		}
		return true, list, nil
	})
	if err := drain(context.Background(), c, "n1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if strings.Join(*evictions, ",") != "web" {
		t.Errorf("evicted %v, want web only: DaemonSet, mirror and ended pods stay, and pods of other nodes", *evictions)
	}
}

func TestDrainBlockedByPDB(t *testing.T) {
	c, _ := fakeCluster(t, map[string]bool{"db": true}, pod("db", "1", nil), pod("web", "2", nil))
	began := time.Now()
	err := cordonAndDrain(context.Background(), c, "n1", 3*time.Second)
	if err == nil || !strings.Contains(err.Error(), "did not finish within 3s") || !strings.Contains(err.Error(), "pod default/db: its PodDisruptionBudget allows no eviction") ||
		!strings.Contains(err.Error(), "the node is uncordoned") {
		t.Fatalf("drain with a PodDisruptionBudget that allows nothing: %v", err)
	}
	node, _ := c.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if node.Spec.Unschedulable {
		t.Errorf("the node stays cordoned after the drain timed out")
	}
	if strings.Contains(err.Error(), "default/web") {
		t.Errorf("the pod evicted is named among those left: %v", err)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("the drain took %s with a timeout of 3s", d)
	}
}
