package cni

import (
	"context"
	"encoding/json"
	"errors"
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
// addresses from podCIDRs, the node's spec.podCIDRs: one address of each
// range, the first of the primary family, and a default route of each
// family through the bridge. host-local keeps its leases under ipamDir.
// mtu is the pods' MTU, smaller than the uplink's where the overlay
// encapsulates; 0 leaves the plugin's default.
func Conflist(podCIDRs []netip.Prefix, ipamDir string, mtu int) ([]byte, error) {
	type m = map[string]any
	if len(podCIDRs) == 0 {
		return nil, errors.New("CNI config: the node has no pod CIDR")
	}
	var ranges [][]m
	var routes []m
	for _, cidr := range podCIDRs {
		ranges = append(ranges, []m{{"subnet": cidr.String()}})
		route := "0.0.0.0/0"
		if cidr.Addr().Is6() {
			route = "::/0"
		}
		routes = append(routes, m{"dst": route})
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
					"ranges":  ranges,
					"routes":  routes,
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
func WriteConflist(dir string, podCIDRs []netip.Prefix, ipamDir string, mtu int) error {
	data, err := Conflist(podCIDRs, ipamDir, mtu)
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

// WaitPodCIDRs watches the node until the controller-manager has given it
// its pod CIDRs (spec.podCIDRs: one of each family of the cluster), and
// returns them. The kubelet registers the node first.
func WaitPodCIDRs(ctx context.Context, client kubernetes.Interface, node string) ([]netip.Prefix, error) {
	selector := fields.OneTermEqualSelector("metadata.name", node).String()
	for {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err == nil {
			if cidrs := podCIDRs(list.Items); len(cidrs) > 0 {
				return cidrs, nil
			}
			w, werr := client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: selector, ResourceVersion: list.ResourceVersion})
			if werr == nil {
				cidrs := watchPodCIDRs(ctx, w)
				w.Stop()
				if len(cidrs) > 0 {
					return cidrs, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("node %s got no pod CIDR: %w", node, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

func watchPodCIDRs(ctx context.Context, w watch.Interface) []netip.Prefix {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, open := <-w.ResultChan():
			if !open {
				return nil
			}
			if n, ok := ev.Object.(*corev1.Node); ok {
				if cidrs := podCIDRs([]corev1.Node{*n}); len(cidrs) > 0 {
					return cidrs
				}
			}
		}
	}
}

// podCIDRs are the first node's pod CIDRs; spec.podCIDR alone on a Node
// written before spec.podCIDRs existed.
func podCIDRs(nodes []corev1.Node) []netip.Prefix {
	for _, n := range nodes {
		raw := n.Spec.PodCIDRs
		if len(raw) == 0 && n.Spec.PodCIDR != "" {
			raw = []string{n.Spec.PodCIDR}
		}
		var out []netip.Prefix
		for _, s := range raw {
			if p, err := netip.ParsePrefix(s); err == nil {
				out = append(out, p)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}
