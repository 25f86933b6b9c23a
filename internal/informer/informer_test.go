package informer

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestTrim(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"a": "b"}, ManagedFields: managed},
		Spec:       corev1.NodeSpec{PodCIDR: "10.42.0.0/24", Taints: []corev1.Taint{{Key: "k"}}},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Images:     []corev1.ContainerImage{{Names: []string{"pause"}}},
		},
	}
	got, err := Trim(node.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	n := got.(*corev1.Node)
	if n.ManagedFields != nil || n.Status.Images != nil {
		t.Errorf("Trim kept managed fields %v, images %v", n.ManagedFields, n.Status.Images)
	}
	if n.Labels["a"] != "b" || n.Spec.PodCIDR != node.Spec.PodCIDR || len(n.Spec.Taints) != 1 || len(n.Status.Addresses) != 1 || len(n.Status.Conditions) != 1 {
		t.Errorf("Trim dropped what controllers read: %+v", n)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", ManagedFields: managed}, Spec: corev1.ServiceSpec{ClusterIP: "10.43.0.1"}}
	got, _ = Trim(svc)
	if s := got.(*corev1.Service); s.ManagedFields != nil || s.Spec.ClusterIP != "10.43.0.1" {
		t.Errorf("Trim of a Service: %+v", s)
	}
	// A tombstone is no object: it passes as it is.
	tomb := "not an object"
	if got, _ := Trim(tomb); got != tomb {
		t.Errorf("Trim changed %v", got)
	}
}
