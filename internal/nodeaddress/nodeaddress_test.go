package nodeaddress

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cloudapi "k8s.io/cloud-provider/api"
)

func TestAddresses(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "agent-1", Annotations: map[string]string{
		cloudapi.AnnotationAlphaProvidedIPAddr: "10.99.0.3,fd00::3",
		ExternalIPAnnotation:                   "203.0.113.4, not-an-ip",
	}}}
	want := []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "10.99.0.3"},
		{Type: corev1.NodeInternalIP, Address: "fd00::3"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.4"},
		{Type: corev1.NodeHostName, Address: "agent-1"},
	}
	if got := Addresses(node); !reflect.DeepEqual(got, want) {
		t.Errorf("Addresses = %v, want %v", got, want)
	}
	bare := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}}
	if got := Addresses(bare); !reflect.DeepEqual(got, []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "bare"}}) {
		t.Errorf("a node without annotations: %v", got)
	}
	meta, err := provider{}.InstanceMetadata(t.Context(), node)
	if err != nil || meta.ProviderID != "kelp://agent-1" || !reflect.DeepEqual(meta.NodeAddresses, want) {
		t.Errorf("InstanceMetadata = %+v, %v", meta, err)
	}
}
