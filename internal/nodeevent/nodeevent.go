package nodeevent

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// timeout bounds the write: an apiserver that does not answer must not
// hold up what failed, which the log has already.
const timeout = 10 * time.Second

// maxMessage is the length the apiserver allows an Event's message.
const maxMessage = 1024

// Warning records a Warning Event with reason and message on the Node
// named node, from component, as the kubelet records its own: in the
// default namespace, with the node's name as its UID, which is what
// kubectl describe node looks for.
func Warning(ctx context.Context, client kubernetes.Interface, node, component, reason, message string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", node, now.UnixNano()), Namespace: metav1.NamespaceDefault},
		InvolvedObject:      corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)},
		Reason:              reason,
		Message:             shorten(message),
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: component, Host: node},
		ReportingController: component,
		ReportingInstance:   component + "-" + node,
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
	}
	if _, err := client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("record event %s on node %s: %w", reason, node, err)
	}
	return nil
}

// Client is a client of the apiserver from a kubeconfig, such as a
// server's admin.kubeconfig.
func Client(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.Timeout = timeout
	return kubernetes.NewForConfig(rc)
}

func shorten(message string) string {
	if len(message) <= maxMessage {
		return message
	}
	return strings.ToValidUTF8(message[:maxMessage-3], "") + "..."
}
