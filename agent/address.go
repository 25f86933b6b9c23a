package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/nodeaddress"
)

// publishExternalIPs puts --node-external-ip on the node's Node, where the
// server's node address controller reads it, or takes it off when there is
// none. It tries until the kubelet has registered the node.
func publishExternalIPs(ctx context.Context, client kubernetes.Interface, node string, ips []netip.Addr) error {
	var value *string
	if len(ips) > 0 {
		s := make([]string, len(ips))
		for i, ip := range ips {
			s[i] = ip.String()
		}
		joined := strings.Join(s, ",")
		value = &joined
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]*string{nodeaddress.ExternalIPAnnotation: value}}})
	if err != nil {
		return err
	}
	for {
		_, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish the node's external IPs: %w", err)
		case <-time.After(time.Second):
		}
	}
}
