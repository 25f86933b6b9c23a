package netpol

import (
	"cmp"
	"net/netip"
	"reflect"
	"slices"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Ruleset is what Apply programs: the chains of the isolated pods of the
// node. It is plain sorted data, so that a sync that would program what
// is already there can tell.
type Ruleset struct {
	// Ingress chains check the packets to their pods, Egress chains the
	// packets from them.
	Ingress []Chain
	Egress  []Chain
}

// Chain is the rules of some pods in one direction: pods whose policies
// come to the same rules share a chain, with every address they have
// (IPv4 and IPv6 alike). A packet no rule allows is dropped.
type Chain struct {
	Pods  []netip.Addr
	Rules []Rule
}

// Rule allows the packets it matches.
type Rule struct {
	// Peers are the addresses at the other end, of either family: the
	// sources of ingress, the destinations of egress. Empty: any address.
	Peers    []Range
	Protocol uint8 // unix.IPPROTO_TCP, _UDP or _SCTP; 0: any
	// FirstPort to LastPort are the destination ports; 0: any.
	FirstPort, LastPort uint16
}

var protocols = map[corev1.Protocol]uint8{
	corev1.ProtocolTCP:  unix.IPPROTO_TCP,
	corev1.ProtocolUDP:  unix.IPPROTO_UDP,
	corev1.ProtocolSCTP: unix.IPPROTO_SCTP,
}

// livePod is a pod that can send or receive through a policy: one with
// addresses of its own (one of each family in a dual-stack cluster) that
// has not finished.
type livePod struct {
	pod *corev1.Pod
	ips []netip.Addr
}

// target is one address of a live pod of the node.
type target struct {
	pod *corev1.Pod
	ip  netip.Addr
}

// Compile returns what enforces policies for the pods on node nodeName,
// with pods and namespaces all those of the cluster (peers can be
// anywhere). A pod is enforced and matched as a peer by every address it
// has, so a policy holds for IPv6 as it does for IPv4.
func Compile(policies []*networkingv1.NetworkPolicy, pods []*corev1.Pod, namespaces []*corev1.Namespace, nodeName string) Ruleset {
	c := cluster{namespaces: map[string]labels.Set{}, pods: map[string][]livePod{}}
	for _, ns := range namespaces {
		c.namespaces[ns.Name] = ns.Labels
	}
	var targets []target
	for _, pod := range pods {
		ips := podIPs(pod)
		if len(ips) == 0 || pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		c.pods[pod.Namespace] = append(c.pods[pod.Namespace], livePod{pod: pod, ips: ips})
		if pod.Spec.NodeName == nodeName {
			for _, ip := range ips {
				targets = append(targets, target{pod: pod, ip: ip})
			}
		}
	}
	// Two pods may claim one address for a moment (the old one's status not
	// yet updated): the newest holds it. Sorting by address also keeps the
	// pods of each chain, and the chains, in order.
	slices.SortFunc(targets, func(a, b target) int {
		return cmp.Or(a.ip.Compare(b.ip), b.pod.CreationTimestamp.Compare(a.pod.CreationTimestamp.Time),
			cmp.Compare(a.pod.Namespace, b.pod.Namespace), cmp.Compare(a.pod.Name, b.pod.Name))
	})
	targets = slices.CompactFunc(targets, func(a, b target) bool { return a.ip == b.ip })

	// Only the policies of namespaces with pods here matter: resolving the
	// peers of the others would be wasted on every node.
	byNamespace := map[string][]compiledPolicy{}
	for _, t := range targets {
		byNamespace[t.pod.Namespace] = nil
	}
	for _, pol := range policies {
		if compiled, local := byNamespace[pol.Namespace]; local {
			byNamespace[pol.Namespace] = append(compiled, c.compile(pol))
		}
	}
	// The rules of a pod are worked out once for all its addresses.
	rulesOf := map[*corev1.Pod]podRules{}
	var r Ruleset
	for _, t := range targets {
		pr, ok := rulesOf[t.pod]
		if !ok {
			pr = podRulesOf(t.pod, byNamespace[t.pod.Namespace])
			rulesOf[t.pod] = pr
		}
		if pr.ingressIsolated {
			r.Ingress = addTo(r.Ingress, t.ip, pr.ingress)
		}
		if pr.egressIsolated {
			r.Egress = addTo(r.Egress, t.ip, pr.egress)
		}
	}
	return r
}

// podRules is what the policies that select a pod allow it.
type podRules struct {
	ingress, egress                 []Rule // normalized
	ingressIsolated, egressIsolated bool
}

func podRulesOf(pod *corev1.Pod, policies []compiledPolicy) podRules {
	var pr podRules
	for _, p := range policies {
		if !p.selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		if p.ingress {
			pr.ingressIsolated = true
			pr.ingress = append(pr.ingress, p.ingressRules(pod)...)
		}
		if p.egress {
			pr.egressIsolated = true
			pr.egress = append(pr.egress, p.egressRules...)
		}
	}
	pr.ingress, pr.egress = normalize(pr.ingress), normalize(pr.egress)
	return pr
}

// podIPs are the pod's addresses, of either family, in the order of its
// status.
func podIPs(pod *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if ip, err := netip.ParseAddr(s); err == nil && !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	add(pod.Status.PodIP)
	for _, ip := range pod.Status.PodIPs {
		add(ip.IP)
	}
	return out
}

// addTo puts pod in the chain with its rules, or in a new one if no pod
// has had these rules yet.
func addTo(chains []Chain, pod netip.Addr, rules []Rule) []Chain {
	for i := range chains {
		if reflect.DeepEqual(chains[i].Rules, rules) {
			chains[i].Pods = append(chains[i].Pods, pod)
			return chains
		}
	}
	return append(chains, Chain{Pods: []netip.Addr{pod}, Rules: rules})
}

// normalize sorts rules and drops duplicates; a rule that allows
// everything makes the others moot.
func normalize(rules []Rule) []Rule {
	if slices.ContainsFunc(rules, func(r Rule) bool { return len(r.Peers) == 0 && r.Protocol == 0 }) {
		return []Rule{{}}
	}
	slices.SortFunc(rules, compareRules)
	return slices.CompactFunc(rules, func(a, b Rule) bool { return compareRules(a, b) == 0 })
}

func compareRules(a, b Rule) int {
	return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.FirstPort, b.FirstPort), cmp.Compare(a.LastPort, b.LastPort),
		slices.CompareFunc(a.Peers, b.Peers, func(x, y Range) int { return cmp.Or(x.First.Compare(y.First), x.Last.Compare(y.Last)) }))
}

// cluster is what the peers of a policy are chosen from.
type cluster struct {
	namespaces map[string]labels.Set
	pods       map[string][]livePod // by namespace
}

// compiledPolicy is a policy with what does not depend on the pod it
// selects worked out once.
type compiledPolicy struct {
	selector        labels.Selector
	ingress, egress bool // the directions it isolates
	from            []ingressRule
	egressRules     []Rule
}

// ingressRule is an ingress rule of a policy with its peers resolved; its
// named ports are resolved against each pod the policy selects.
type ingressRule struct {
	peers []Range // empty: any
	ports []networkingv1.NetworkPolicyPort
}

// peers is what the peers of one rule of a policy come to.
type peers struct {
	any    bool // the rule names no peers
	ranges []Range
	pods   []livePod // the pods among the ranges, for named ports
}

func (c cluster) compile(pol *networkingv1.NetworkPolicy) compiledPolicy {
	p := compiledPolicy{selector: selector(&pol.Spec.PodSelector, pol)}
	if len(pol.Spec.PolicyTypes) == 0 {
		p.ingress, p.egress = true, len(pol.Spec.Egress) > 0
	}
	for _, t := range pol.Spec.PolicyTypes {
		p.ingress = p.ingress || t == networkingv1.PolicyTypeIngress
		p.egress = p.egress || t == networkingv1.PolicyTypeEgress
	}
	if p.ingress {
		for _, rule := range pol.Spec.Ingress {
			if peers := c.peers(pol, rule.From); peers.any || len(peers.ranges) > 0 {
				p.from = append(p.from, ingressRule{peers: peers.ranges, ports: rule.Ports})
			}
		}
	}
	if p.egress {
		for _, rule := range pol.Spec.Egress {
			p.egressRules = append(p.egressRules, c.egressRules(c.peers(pol, rule.To), rule.Ports)...)
		}
	}
	return p
}

// ingressRules are the rules of the policy for pod, which names the ports
// of named entries.
func (p compiledPolicy) ingressRules(pod *corev1.Pod) []Rule {
	var out []Rule
	for _, rule := range p.from {
		if len(rule.ports) == 0 {
			out = append(out, Rule{Peers: rule.peers})
		}
		for _, np := range rule.ports {
			if r, ok := portRule(np, pod); ok {
				r.Peers = rule.peers
				out = append(out, r)
			}
		}
	}
	return out
}

// egressRules are the rules of one egress rule of a policy. A named port
// is resolved against each destination pod, so its destinations are
// grouped by the number the name comes to.
func (c cluster) egressRules(to peers, ports []networkingv1.NetworkPolicyPort) []Rule {
	if !to.any && len(to.ranges) == 0 {
		return nil
	}
	if len(ports) == 0 {
		return []Rule{{Peers: to.ranges}}
	}
	var out []Rule
	for _, np := range ports {
		if np.Port == nil || np.Port.Type != intstr.String {
			if r, ok := portRule(np, nil); ok {
				r.Peers = to.ranges
				out = append(out, r)
			}
			continue
		}
		candidates := to.pods
		if to.any {
			candidates = nil
			for _, pods := range c.pods {
				candidates = append(candidates, pods...)
			}
		}
		byPort := map[uint16][]Range{}
		var protocol uint8
		for _, dst := range candidates {
			if r, ok := portRule(np, dst.pod); ok {
				protocol = r.Protocol
				byPort[r.FirstPort] = append(byPort[r.FirstPort], addrRanges(dst.ips)...)
			}
		}
		for port, ranges := range byPort {
			out = append(out, Rule{Peers: merge(ranges), Protocol: protocol, FirstPort: port, LastPort: port})
		}
	}
	return out
}

// peers resolves the peers of a rule of pol.
func (c cluster) peers(pol *networkingv1.NetworkPolicy, list []networkingv1.NetworkPolicyPeer) peers {
	if len(list) == 0 {
		return peers{any: true}
	}
	var out peers
	for _, peer := range list {
		switch {
		case peer.IPBlock != nil:
			rs, _ := ipBlockRanges(peer.IPBlock.CIDR, peer.IPBlock.Except)
			out.ranges = append(out.ranges, rs...)
		case peer.PodSelector != nil || peer.NamespaceSelector != nil:
			for _, p := range c.selectPods(pol, peer) {
				out.pods = append(out.pods, p)
				out.ranges = append(out.ranges, addrRanges(p.ips)...)
			}
		}
	}
	out.ranges = merge(out.ranges)
	return out
}

// addrRanges are ranges of one address each.
func addrRanges(ips []netip.Addr) []Range {
	out := make([]Range, len(ips))
	for i, ip := range ips {
		out[i] = Range{First: ip, Last: ip}
	}
	return out
}

// selectPods are the pods a peer of pol selects: by their labels in pol's
// namespace, or in the namespaces the peer selects by theirs.
func (c cluster) selectPods(pol *networkingv1.NetworkPolicy, peer networkingv1.NetworkPolicyPeer) []livePod {
	pods := labels.Everything()
	if peer.PodSelector != nil {
		pods = selector(peer.PodSelector, pol)
	}
	namespaces := []string{pol.Namespace}
	if peer.NamespaceSelector != nil {
		nsSelector := selector(peer.NamespaceSelector, pol)
		namespaces = nil
		for name, l := range c.namespaces {
			if nsSelector.Matches(l) {
				namespaces = append(namespaces, name)
			}
		}
	}
	var out []livePod
	for _, ns := range namespaces {
		for _, p := range c.pods[ns] {
			if pods.Matches(labels.Set(p.pod.Labels)) {
				out = append(out, p)
			}
		}
	}
	return out
}

// selector is s as a selector; one that does not parse selects nothing,
// rather than more than pol says.
func selector(s *metav1.LabelSelector, pol *networkingv1.NetworkPolicy) labels.Selector {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		log.WithError(err).WithField("policy", pol.Namespace+"/"+pol.Name).Debug("invalid label selector matches nothing")
		return labels.Nothing()
	}
	return sel
}

// portRule is the protocol and ports a ports entry allows; pod names the
// port of a named entry (nil: a named entry matches nothing). ok is false
// if the entry matches nothing.
func portRule(np networkingv1.NetworkPolicyPort, pod *corev1.Pod) (r Rule, ok bool) {
	protocol := corev1.ProtocolTCP
	if np.Protocol != nil {
		protocol = *np.Protocol
	}
	if r.Protocol, ok = protocols[protocol]; !ok {
		return Rule{}, false
	}
	switch {
	case np.Port == nil:
	case np.Port.Type == intstr.String:
		if pod == nil {
			return Rule{}, false
		}
		n, ok := namedPort(pod, np.Port.StrVal, protocol)
		if !ok {
			return Rule{}, false
		}
		r.FirstPort, r.LastPort = n, n
	default:
		first, last := np.Port.IntVal, np.Port.IntVal
		if np.EndPort != nil {
			last = *np.EndPort
		}
		if first < 1 || last < first || last > 65535 {
			return Rule{}, false
		}
		r.FirstPort, r.LastPort = uint16(first), uint16(last)
	}
	return r, true
}

// namedPort is the number of the container port of pod called name.
func namedPort(pod *corev1.Pod, name string, protocol corev1.Protocol) (uint16, bool) {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name && cmp.Or(p.Protocol, corev1.ProtocolTCP) == protocol && p.ContainerPort > 0 && p.ContainerPort <= 65535 {
				return uint16(p.ContainerPort), true
			}
		}
	}
	return 0, false
}
