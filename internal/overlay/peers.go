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
	AnnotationPrefix  = "overlay.kelp.io/"
	AnnotationBackend = AnnotationPrefix + "backend"
	// AnnotationPublicIP and AnnotationPublicIPv6 are the node's IPv4 and
	// IPv6 node IPs, as flannel's public-ip and public-ipv6.
	AnnotationPublicIP   = AnnotationPrefix + "public-ip"
	AnnotationPublicIPv6 = AnnotationPrefix + "public-ipv6"
	AnnotationVTEPMAC    = AnnotationPrefix + "vtep-mac"
)

// Peer is another node whose pods this node routes to.
type Peer struct {
	Name string
	// PodCIDRs are those of the families of the cluster, in the order
	// of its cluster CIDRs.
	PodCIDRs []netip.Prefix
	// IPs are the node IPs it published, IPv4 first.
	IPs []netip.Addr
	MAC net.HardwareAddr // of its VXLAN device; nil for host-gw
}

// Peers returns the nodes other than cfg.NodeName that this node can route
// to with cfg.Backend, by name. Nodes are left out (and logged at debug)
// until they have pod CIDRs in the cluster CIDRs and valid annotations of
// cfg.Backend: for vxlan a node IP of the family this node's VXLAN device
// runs over, for host-gw one of the family of each pod CIDR. So are nodes
// whose pod CIDRs overlap another node's or whose VTEP MAC another node
// uses too, since a route or an FDB entry can only lead to one of them.
func Peers(nodes []*corev1.Node, cfg Config) []Peer {
	self := Peer{Name: cfg.NodeName}
	if cfg.Backend == BackendVXLAN {
		self.MAC = vtepMAC(cfg.NodeName)
	}
	var candidates []Peer
	for _, n := range nodes {
		if n.Name == cfg.NodeName {
			self.PodCIDRs, _ = nodePodCIDRs(n, cfg)
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

// nodePodCIDRs returns the pod CIDRs of node n that cfg routes, masked, in
// the order of the cluster CIDRs. One of a family the cluster has no CIDR
// of is left out: the cluster dropped that family, and what kelp routed of
// it goes. One outside the cluster CIDR of its family is an error.
func nodePodCIDRs(n *corev1.Node, cfg Config) ([]netip.Prefix, error) {
	given := n.Spec.PodCIDRs
	if len(given) == 0 && n.Spec.PodCIDR != "" {
		given = []string{n.Spec.PodCIDR}
	}
	if len(given) == 0 {
		return nil, errors.New("no pod CIDR yet")
	}
	byFamily := map[family]netip.Prefix{}
	for _, s := range given {
		cidr, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("pod CIDR: %w", err)
		}
		cidr = cidr.Masked()
		f := familyOf(cidr.Addr())
		if _, ok := byFamily[f]; ok {
			return nil, fmt.Errorf("pod CIDRs %v: more than one %s CIDR", given, f)
		}
		byFamily[f] = cidr
	}
	var out []netip.Prefix
	for _, cluster := range cfg.ClusterCIDRs {
		cidr, ok := byFamily[familyOf(cluster.Addr())]
		if !ok {
			continue
		}
		if cidr.Addr().Is4In6() || cidr.Bits() < cluster.Bits() || !cluster.Contains(cidr.Addr()) {
			return nil, fmt.Errorf("pod CIDR %s is not in the cluster CIDR %s", cidr, cluster)
		}
		out = append(out, cidr)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("pod CIDRs %v: none is of a family of the cluster CIDRs %v", given, cfg.ClusterCIDRs)
	}
	return out, nil
}

// peer reads how to reach the pods of node n.
func peer(n *corev1.Node, cfg Config) (Peer, error) {
	cidrs, err := nodePodCIDRs(n, cfg)
	if err != nil {
		return Peer{}, err
	}
	if b := n.Annotations[AnnotationBackend]; b != cfg.Backend {
		return Peer{}, fmt.Errorf("backend %q, not %q", b, cfg.Backend)
	}
	p := Peer{Name: n.Name, PodCIDRs: cidrs}
	for f, key := range map[family]string{ipv4: AnnotationPublicIP, ipv6: AnnotationPublicIPv6} {
		s, ok := n.Annotations[key]
		if !ok {
			continue
		}
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Is4In6() || ip.Zone() != "" || familyOf(ip) != f {
			return Peer{}, fmt.Errorf("annotation %s %q is no %s address", key, s, f)
		}
		p.IPs = append(p.IPs, ip)
	}
	slices.SortFunc(p.IPs, func(a, b netip.Addr) int { return a.Compare(b) }) // IPv4 first
	switch cfg.Backend {
	case BackendVXLAN:
		// Its device runs over the family ours does, or they cannot
		// talk: both follow the same rule, so neither routes to the
		// other.
		want := familyOf(cfg.underlay())
		if ip := underlayOf(p.IPs, cfg.primary()); !ip.IsValid() || familyOf(ip) != want {
			return Peer{}, fmt.Errorf("this node's VXLAN runs over %s, and the node published no %s node IP (annotations %s, %s): give every node a node IP of the family of the first cluster CIDR",
				want, want, AnnotationPublicIP, AnnotationPublicIPv6)
		}
		mac, err := net.ParseMAC(n.Annotations[AnnotationVTEPMAC])
		if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
			return Peer{}, fmt.Errorf("annotation %s %q is no unicast Ethernet address", AnnotationVTEPMAC, n.Annotations[AnnotationVTEPMAC])
		}
		p.MAC = mac
	case BackendHostGW:
		for _, cidr := range cidrs {
			if f := familyOf(cidr.Addr()); !nodeIP(p.IPs, f).IsValid() {
				return Peer{}, fmt.Errorf("host-gw routes its %s pod CIDR %s via its %s node IP, and it published none", f, cidr, f)
			}
		}
	}
	return p, nil
}

// clashing returns the name of the node, self or one of nodes, whose pod
// CIDRs overlap p's or whose VTEP MAC is p's; "" if there is none.
func clashing(p, self Peer, nodes []Peer) string {
	clashes := func(q Peer) bool {
		if q.Name == p.Name {
			return false
		}
		for _, a := range p.PodCIDRs {
			for _, b := range q.PodCIDRs {
				if a.Overlaps(b) {
					return true
				}
			}
		}
		return p.MAC != nil && bytes.Equal(p.MAC, q.MAC)
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
