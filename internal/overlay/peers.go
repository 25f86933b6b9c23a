package overlay

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
)

// The annotations by which a node tells the others how to reach its pods.
const (
	// AnnotationPrefix starts every annotation the overlay writes; a
	// node's controllers may write no other on their Node
	// (internal/systemobjects).
	AnnotationPrefix   = "overlay.kelp.io/"
	AnnotationBackend  = AnnotationPrefix + "backend"
	AnnotationPublicIP = AnnotationPrefix + "public-ip"
	AnnotationVTEPMAC  = AnnotationPrefix + "vtep-mac"
)

// Peer is another node whose pods this node routes to.
type Peer struct {
	Name    string
	PodCIDR netip.Prefix
	IP      netip.Addr       // the node IP it published
	MAC     net.HardwareAddr // of its VXLAN device; nil for host-gw
}

// Peers returns the nodes other than cfg.NodeName that this node can route
// to with cfg.Backend, by name. Nodes are left out (and logged at debug)
// until they have a pod CIDR in the cluster CIDR and valid annotations of
// cfg.Backend; so are nodes whose pod CIDR overlaps another node's or
// whose VTEP MAC another node uses too, since a route or an FDB entry can
// only lead to one of them.
func Peers(nodes []*corev1.Node, cfg Config) []Peer {
	self := Peer{Name: cfg.NodeName}
	if cfg.Backend == BackendVXLAN {
		self.MAC = vtepMAC(cfg.NodeName)
	}
	var candidates []Peer
	for _, n := range nodes {
		if n.Name == cfg.NodeName {
			if cidr, err := netip.ParsePrefix(n.Spec.PodCIDR); err == nil {
				self.PodCIDR = cidr.Masked()
			}
			continue
		}
		p, err := peer(n, cfg)
		if err != nil {
			log.WithField("node", n.Name).WithError(err).Debug("not routing to node")
			continue
		}
		candidates = append(candidates, p)
	}
	var out []Peer
	for _, p := range candidates {
		if other := clashing(p, self, candidates); other != "" {
			log.WithFields(logrus.Fields{"node": p.Name, "other": other}).Debug("not routing to node: its pod CIDR or VTEP MAC clashes with the other node's")
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// peer reads how to reach the pods of node n.
func peer(n *corev1.Node, cfg Config) (Peer, error) {
	if n.Spec.PodCIDR == "" {
		return Peer{}, errors.New("no pod CIDR yet")
	}
	cidr, err := netip.ParsePrefix(n.Spec.PodCIDR)
	if err != nil {
		return Peer{}, fmt.Errorf("pod CIDR: %w", err)
	}
	cidr = cidr.Masked()
	if !cidr.Addr().Is4() || cidr.Bits() < cfg.ClusterCIDR.Bits() || !cfg.ClusterCIDR.Contains(cidr.Addr()) {
		return Peer{}, fmt.Errorf("pod CIDR %s is not in the cluster CIDR %s", cidr, cfg.ClusterCIDR)
	}
	if b := n.Annotations[AnnotationBackend]; b != cfg.Backend {
		return Peer{}, fmt.Errorf("backend %q, not %q", b, cfg.Backend)
	}
	ip, err := netip.ParseAddr(n.Annotations[AnnotationPublicIP])
	if err != nil || !ip.Is4() {
		return Peer{}, fmt.Errorf("annotation %s %q is no IPv4 address", AnnotationPublicIP, n.Annotations[AnnotationPublicIP])
	}
	p := Peer{Name: n.Name, PodCIDR: cidr, IP: ip}
	if cfg.Backend == BackendVXLAN {
		mac, err := net.ParseMAC(n.Annotations[AnnotationVTEPMAC])
		if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
			return Peer{}, fmt.Errorf("annotation %s %q is no unicast Ethernet address", AnnotationVTEPMAC, n.Annotations[AnnotationVTEPMAC])
		}
		p.MAC = mac
	}
	return p, nil
}

// clashing returns the name of the node, self or one of nodes, whose pod
// CIDR overlaps p's or whose VTEP MAC is p's; "" if there is none.
func clashing(p, self Peer, nodes []Peer) string {
	clashes := func(q Peer) bool {
		return q.Name != p.Name && (p.PodCIDR.Overlaps(q.PodCIDR) || (p.MAC != nil && bytes.Equal(p.MAC, q.MAC)))
	}
	if clashes(self) {
		return self.Name
	}
	for _, q := range nodes {
		if clashes(q) {
			return q.Name
		}
	}
	return ""
}

// vtepMAC is the MAC address of node's VXLAN device. It follows from the
// name alone, so a restarted or rebooted node comes back with the address
// its peers' FDB and neighbour entries still hold.
func vtepMAC(node string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("kelp vtep " + node))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^1 | 2 // unicast, locally administered
	return mac
}
