package cni

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// Bridge is the node's pod bridge.
const Bridge = "cni0"

// ConflistName is the file containerd reads the pod network from.
const ConflistName = "10-kelp.conflist"

// Conflist returns the CNI network configuration for a node whose pods get
// addresses from podCIDR; host-local keeps its leases under ipamDir. mtu is
// the pods' MTU, smaller than the uplink's where the overlay encapsulates;
// 0 leaves the plugin's default.
func Conflist(podCIDR netip.Prefix, ipamDir string, mtu int) ([]byte, error) {
	type m = map[string]any
	defaultRoute := "0.0.0.0/0"
	if podCIDR.Addr().Is6() {
		defaultRoute = "::/0"
	}
	conf := m{
		"cniVersion": "1.0.0",
		"name":       "kelp",
		"plugins": []m{
			{
				"type":        "bridge",
				"bridge":      Bridge,
				"isGateway":   true,
				"hairpinMode": true,
				// Masquerade is kelp's own nftables rule, not the
				// plugin's, which would need the iptables binary.
				"ipMasq": false,
				"ipam": m{
					"type":    "host-local",
					"dataDir": ipamDir,
					"ranges":  [][]m{{{"subnet": podCIDR.String()}}},
					"routes":  []m{{"dst": defaultRoute}},
				},
			},
			{"type": "bandwidth", "capabilities": m{"bandwidth": true}},
		},
	}
	if mtu > 0 {
		conf["plugins"].([]m)[0]["mtu"] = mtu
	}
	return json.MarshalIndent(conf, "", "  ")
}

// WriteConflist writes the configuration into dir atomically: containerd
// watches the directory and must never read half a file.
func WriteConflist(dir string, podCIDR netip.Prefix, ipamDir string, mtu int) error {
	data, err := Conflist(podCIDR, ipamDir, mtu)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write CNI config: %w", err)
	}
	path := filepath.Join(dir, ConflistName)
	if old, err := os.ReadFile(path); err == nil && string(old) == string(data) {
		return nil
	}
	if err := atomicfile.Write(path, data, 0o644); err != nil {
		return fmt.Errorf("write CNI config: %w", err)
	}
	return nil
}

// WaitPodCIDR watches the node until the controller-manager has given it a
// pod CIDR, and returns it. The kubelet registers the node first.
func WaitPodCIDR(ctx context.Context, client kubernetes.Interface, node string) (netip.Prefix, error) {
	selector := fields.OneTermEqualSelector("metadata.name", node).String()
	for {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err == nil {
			if cidr, ok := podCIDR(list.Items); ok {
				return cidr, nil
			}
			w, werr := client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: selector, ResourceVersion: list.ResourceVersion})
			if werr == nil {
				cidr, ok := watchPodCIDR(ctx, w)
				w.Stop()
				if ok {
					return cidr, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return netip.Prefix{}, fmt.Errorf("node %s got no pod CIDR: %w", node, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

func watchPodCIDR(ctx context.Context, w watch.Interface) (netip.Prefix, bool) {
	for {
		select {
		case <-ctx.Done():
			return netip.Prefix{}, false
		case ev, open := <-w.ResultChan():
			if !open {
				return netip.Prefix{}, false
			}
			if n, ok := ev.Object.(*corev1.Node); ok {
				if cidr, ok := podCIDR([]corev1.Node{*n}); ok {
					return cidr, true
				}
			}
		}
	}
}

func podCIDR(nodes []corev1.Node) (netip.Prefix, bool) {
	for _, n := range nodes {
		if p, err := netip.ParsePrefix(n.Spec.PodCIDR); err == nil {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
