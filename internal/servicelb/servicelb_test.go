package servicelb

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func node(name, ip string, ready bool, labels map[string]string) *corev1.Node {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}},
		},
	}
}

func ips(in []corev1.LoadBalancerIngress) []string {
	var out []string
	for _, i := range in {
		out = append(out, i.IP)
	}
	return out
}

func TestIngress(t *testing.T) {
	enabled := map[string]string{EnableLabel: "true"}
	for _, tc := range []struct {
		name  string
		nodes []*corev1.Node
		want  []string
	}{
		{"every ready node", []*corev1.Node{node("b", "10.0.0.2", true, nil), node("a", "10.0.0.1", true, nil), node("c", "10.0.0.3", false, nil)}, []string{"10.0.0.1", "10.0.0.2"}},
		{"only labelled nodes once one is", []*corev1.Node{node("a", "10.0.0.1", true, nil), node("b", "10.0.0.2", true, enabled)}, []string{"10.0.0.2"}},
		{"no node", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ips(Ingress(tc.nodes)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ingress %v, want %v", got, tc.want)
			}
		})
	}
}
