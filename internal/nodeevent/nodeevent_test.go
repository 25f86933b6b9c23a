package nodeevent

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The event is where kubectl describe node finds the kubelet's: in
// default, on the Node by name and with the name as UID.
func TestWarning(t *testing.T) {
	client := fake.NewClientset()
	long := strings.Repeat("x", 3000)
	if err := Warning(context.Background(), client, "pi-1", "kelp-snapshot", "SnapshotUploadFailed", long); err != nil {
		t.Fatal(err)
	}
	list, err := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("events: %v, %v", list, err)
	}
	ev := list.Items[0]
	want := corev1.ObjectReference{Kind: "Node", Name: "pi-1", UID: "pi-1"}
	if ev.InvolvedObject != want || ev.Type != corev1.EventTypeWarning || ev.Reason != "SnapshotUploadFailed" || ev.Source.Component != "kelp-snapshot" || ev.Count != 1 {
		t.Errorf("event %+v", ev)
	}
	if len(ev.Message) != maxMessage || !strings.HasSuffix(ev.Message, "...") {
		t.Errorf("a %d-byte message became %d bytes", len(long), len(ev.Message))
	}
}
