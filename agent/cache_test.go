package agent

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kelp-dev/kelp/internal/overlay"
)

// The node's cache keeps of a Node what the overlay and the registry
// mirror read, and of other kinds what their readers' own trims keep.
func TestTrim(t *testing.T) {
	tr := trim("n1")
	ann := overlay.AnnotationPrefix + "backend-data"
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n2", ResourceVersion: "7", Annotations: map[string]string{ann: "x", "other": "y"}},
		Spec:       corev1.NodeSpec{PodCIDR: "10.42.1.0/24", PodCIDRs: []string{"10.42.1.0/24"}},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.2"}},
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"},
			},
			Images: []corev1.ContainerImage{{Names: []string{"pause"}}},
		},
	}
	got, err := tr(node)
	if err != nil {
		t.Fatal(err)
	}
	n := got.(*corev1.Node)
	if n.Name != "n2" || n.ResourceVersion != "7" || n.Annotations[ann] != "x" || n.Annotations["other"] != "" || n.Spec.PodCIDR != "10.42.1.0/24" || len(n.Spec.PodCIDRs) != 1 {
		t.Errorf("the overlay's part of the Node: %+v", n)
	}
	if len(n.Status.Addresses) != 1 || len(n.Status.Conditions) != 1 || n.Status.Conditions[0].Type != corev1.NodeReady || n.Status.Conditions[0].Status != corev1.ConditionTrue || n.Status.Images != nil {
		t.Errorf("the mirror's part of the Node: %+v", n.Status)
	}

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"app": "a"}}, Spec: corev1.PodSpec{NodeName: "n1", Volumes: []corev1.Volume{{Name: "v"}}}}
	got, _ = tr(pod)
	if p := got.(*corev1.Pod); p.Labels["app"] != "a" || p.Spec.NodeName != "n1" || p.Spec.Volumes != nil {
		t.Errorf("the Pod, trimmed for network policy: %+v", p)
	}
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Annotations: map[string]string{"elsewhere": "x"}}}
	got, _ = tr(claim)
	if c := got.(*corev1.PersistentVolumeClaim); c.Name != "c" || c.Annotations != nil {
		t.Errorf("a claim of another node, trimmed for local storage: %+v", c)
	}
	namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"a": "b"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}}
	got, _ = tr(namespace)
	if ns := got.(*corev1.Namespace); ns.Labels["a"] != "b" || ns.ManagedFields != nil {
		t.Errorf("a Namespace: %+v", ns)
	}
}
