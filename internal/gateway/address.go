package gateway

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/kelp-dev/kelp/internal/config"
)

// excludeLabel marks nodes that hold no load balancer address, as for
// upstream's service controller.
const excludeLabel = corev1.LabelNodeExcludeBalancers

// addressing is what a Gateway got of the address ranges: its addresses,
// or why it has none.
type addressing struct {
	addrs []netip.Addr
	// unsupported says what of spec.addresses kelp cannot give: the
	// Gateway is not Accepted. Else reason and msg say why the Gateway
	// has no address: it is not Programmed.
	unsupported string
	reason, msg string
}

// assign gives each Gateway (oldest first) its addresses from the ranges:
// those of its spec.addresses, else one of each family of the ranges. A
// Gateway keeps the addresses its status names while they are still
// right for it, so that they do not move when other Gateways come and go.
func assign(ranges []config.AddressRange, gateways []*gatewayv1.Gateway, nodes []*corev1.Node) map[types.NamespacedName]*addressing {
	out := map[types.NamespacedName]*addressing{}
	taken := map[netip.Addr]string{} // by whom: a Gateway, or a node
	for _, n := range nodes {
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				taken[ip] = "node " + n.Name
			}
		}
	}
	// An address every node that may hold it found in use is another
	// machine's: given to no Gateway.
	for _, r := range ranges {
		for _, n := range nodes {
			for s := range strings.SplitSeq(n.Annotations[InUseAnnotation], ",") {
				ip, err := netip.ParseAddr(strings.TrimSpace(s))
				if err != nil || !r.Contains(ip) || taken[ip] != "" {
					continue
				}
				if found := inUseOnNetwork(ip, nodes); len(found) > 0 {
					taken[ip] = "another machine on its network, as " + nodeList(found) + " found"
				}
			}
		}
	}
	inRanges := func(a netip.Addr) bool {
		return slices.ContainsFunc(ranges, func(r config.AddressRange) bool { return r.Contains(a) })
	}
	// requested are the spec's addresses; wantFamilies the families of
	// those the Gateway lets kelp choose.
	type request struct {
		requested    []netip.Addr
		wantFamilies []bool // is IPv6
	}
	requests := map[types.NamespacedName]*request{}
	for _, gw := range gateways {
		a, rq := &addressing{}, &request{}
		out[nameOf(gw)], requests[nameOf(gw)] = a, rq
		for _, sa := range gw.Spec.Addresses {
			if sa.Type != nil && *sa.Type != gatewayv1.IPAddressType {
				a.unsupported = fmt.Sprintf("spec.addresses asks for an address of type %s: kelp gives Gateways IP addresses only", *sa.Type)
				continue
			}
			if sa.Value == "" {
				// Any address: of each family the ranges have, once.
				rq.wantFamilies = familiesOf(ranges)
				continue
			}
			ip, err := netip.ParseAddr(sa.Value)
			if err != nil {
				a.unsupported = fmt.Sprintf("spec.addresses: %q is not an IP address", sa.Value)
				continue
			}
			rq.requested = append(rq.requested, ip.Unmap())
		}
		if len(gw.Spec.Addresses) == 0 {
			rq.wantFamilies = familiesOf(ranges)
		}
	}
	if len(ranges) == 0 {
		for _, gw := range gateways {
			if a := out[nameOf(gw)]; len(gw.Spec.Addresses) > 0 {
				a.reason = string(gatewayv1.GatewayReasonAddressNotAssigned)
				a.msg = "kelp gives Gateways addresses of their own only from the server's --gateway-address-range, which is not set: set it, or remove spec.addresses to serve the Gateway on the nodes' addresses"
			}
		}
		return out
	}
	// First what the Gateways hold, then what they ask for, then new
	// addresses for the others.
	for _, gw := range gateways {
		a, rq := out[nameOf(gw)], requests[nameOf(gw)]
		for _, sa := range gw.Status.Addresses {
			ip, err := netip.ParseAddr(sa.Value)
			if err != nil || !inRanges(ip) || taken[ip] != "" {
				continue
			}
			if slices.Contains(rq.requested, ip) || (slices.Contains(rq.wantFamilies, ip.Is6()) && !slices.ContainsFunc(a.addrs, func(b netip.Addr) bool { return b.Is6() == ip.Is6() })) {
				a.addrs = append(a.addrs, ip)
				taken[ip] = "Gateway " + nameOf(gw).String()
			}
		}
	}
	for _, gw := range gateways {
		a, rq := out[nameOf(gw)], requests[nameOf(gw)]
		for _, ip := range rq.requested {
			switch {
			case slices.Contains(a.addrs, ip):
			case !inRanges(ip):
				a.reason = string(gatewayv1.GatewayReasonAddressNotUsable)
				a.msg = fmt.Sprintf("spec.addresses: %s is not in the server's --gateway-address-range %s: ask for one of those, or widen the range", ip, formatRanges(ranges))
			case taken[ip] != "":
				a.reason = string(gatewayv1.GatewayReasonAddressNotUsable)
				a.msg = fmt.Sprintf("spec.addresses: %s is in use by %s: ask for another address", ip, taken[ip])
			default:
				a.addrs = append(a.addrs, ip)
				taken[ip] = "Gateway " + nameOf(gw).String()
			}
		}
	}
	for _, gw := range gateways {
		a, rq := out[nameOf(gw)], requests[nameOf(gw)]
		for _, v6 := range rq.wantFamilies {
			if slices.ContainsFunc(a.addrs, func(b netip.Addr) bool { return b.Is6() == v6 && !slices.Contains(rq.requested, b) }) {
				continue
			}
			ip, ok := free(ranges, v6, taken)
			if !ok {
				a.reason = string(gatewayv1.GatewayReasonAddressNotAssigned)
				a.msg = fmt.Sprintf("no %s address of the server's --gateway-address-range %s is free: widen the range or delete a Gateway", config.FamilyName(v6), formatRanges(ranges))
				continue
			}
			a.addrs = append(a.addrs, ip)
			taken[ip] = "Gateway " + nameOf(gw).String()
		}
		if a.reason != "" {
			// All or nothing: a Gateway is served on every address it
			// has or on none.
			for _, ip := range a.addrs {
				delete(taken, ip)
			}
			a.addrs = nil
		}
		slices.SortFunc(a.addrs, func(x, y netip.Addr) int { return cmp.Compare(x.BitLen(), y.BitLen()) })
	}
	return out
}

// free is the first address of the ranges of the family (IPv6 or not)
// that is not taken.
func free(ranges []config.AddressRange, v6 bool, taken map[netip.Addr]string) (netip.Addr, bool) {
	for _, r := range ranges {
		if r.First.Is6() != v6 {
			continue
		}
		for ip := r.First; r.Contains(ip); ip = ip.Next() {
			if taken[ip] == "" {
				return ip, true
			}
		}
	}
	return netip.Addr{}, false
}

// familiesOf are the families (is IPv6) of the ranges.
func familiesOf(ranges []config.AddressRange) []bool {
	var out []bool
	for _, r := range ranges {
		if !slices.Contains(out, r.First.Is6()) {
			out = append(out, r.First.Is6())
		}
	}
	return out
}

func formatRanges(ranges []config.AddressRange) string {
	s := make([]string, len(ranges))
	for i, r := range ranges {
		s[i] = r.String()
	}
	return strings.Join(s, ",")
}

// chooseHolder chooses the node that holds addr among the nodes that may:
// the Ready ones, not cordoned (a node being drained gives its addresses
// up before it stops), not labelled node.kubernetes.io/exclude-from-
// external-load-balancers, and with an interface on addr's network (as
// their data paths say). The node that holds it now (was, "" if none)
// keeps it while it may: a move breaks the connections open to it. Else
// the choice is by highest hash of address and node name, so that every
// address has its own order of nodes. ok is false when no node may.
func chooseHolder(addr netip.Addr, nodes []*corev1.Node, was string) (string, bool) {
	var best string
	var bestScore uint64
	for _, n := range nodes {
		if !mayHold(n, addr) {
			continue
		}
		if n.Name == was {
			return was, true
		}
		h := fnv.New64a()
		h.Write([]byte(addr.String() + "/" + n.Name))
		if s := h.Sum64(); best == "" || s > bestScore || (s == bestScore && n.Name < best) {
			best, bestScore = n.Name, s
		}
	}
	return best, best != ""
}

func mayHold(n *corev1.Node, addr netip.Addr) bool {
	return mayHoldOnNetwork(n, addr) && !foundInUse(n, addr)
}

// mayHoldOnNetwork is mayHold but for what the node found of addr.
//
// A node says itself which networks it is on (NetworksAnnotation), and
// the server cannot check a node's links: so a network counts only if it
// also holds an address the Node's status gives the node (its InternalIP
// or ExternalIP, by which the cluster reaches it), and the address is not
// one of the node's own. A node that claims a network it is not on gets
// no address of the admin's ranges outside the networks of its own
// addresses. (That the ranges hold no node's or cluster's address the
// server's flags and assign see to.)
func mayHoldOnNetwork(n *corev1.Node, addr netip.Addr) bool {
	if n.Spec.Unschedulable || n.DeletionTimestamp != nil {
		return false
	}
	if _, excluded := n.Labels[excludeLabel]; excluded {
		return false
	}
	var own []netip.Addr
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && (a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP) {
			own = append(own, ip.Unmap())
		}
	}
	if slices.Contains(own, addr) {
		return false
	}
	onNetwork := false
	for s := range strings.SplitSeq(n.Annotations[NetworksAnnotation], ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err == nil && p.Contains(addr) && slices.ContainsFunc(own, p.Contains) {
			onNetwork = true
		}
	}
	if !onNetwork {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// foundInUse says whether node n found addr in use by another machine on
// its network (InUseAnnotation).
func foundInUse(n *corev1.Node, addr netip.Addr) bool {
	for s := range strings.SplitSeq(n.Annotations[InUseAnnotation], ",") {
		if ip, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil && ip.Unmap() == addr {
			return true
		}
	}
	return false
}

// inUseOnNetwork are the nodes that found addr in use, when every node
// that may otherwise hold it did; else none. What one node reports takes
// only that node off the address: a node's root cannot take an address
// from the others by saying it is in use.
func inUseOnNetwork(addr netip.Addr, nodes []*corev1.Node) []string {
	var found []string
	for _, n := range nodes {
		if !mayHoldOnNetwork(n, addr) {
			continue
		}
		if !foundInUse(n, addr) {
			return nil
		}
		found = append(found, n.Name)
	}
	slices.Sort(found)
	return found
}

// nodeList names nodes for a message: "node a", "nodes a, b".
func nodeList(names []string) string {
	if len(names) == 1 {
		return "node " + names[0]
	}
	return "nodes " + strings.Join(names, ", ")
}
