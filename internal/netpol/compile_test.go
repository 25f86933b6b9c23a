package netpol

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

const node = "node-a"

type podOption func(*corev1.Pod)

func pod(ns, name, ip, nodeName string, labels map[string]string, opts ...podOption) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
	if ip != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func ports(ps ...corev1.ContainerPort) podOption {
	return func(p *corev1.Pod) { p.Spec.Containers[0].Ports = ps }
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	l := map[string]string{"kubernetes.io/metadata.name": name}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

func policy(ns, name string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
}

func selects(labels map[string]string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: labels}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// ranges parses "a" (one address) and "a-b".
func ranges(ss ...string) []Range {
	var out []Range
	for _, s := range ss {
		first, last, ok := strings.Cut(s, "-")
		if !ok {
			last = first
		}
		out = append(out, Range{First: netip.MustParseAddr(first), Last: netip.MustParseAddr(last)})
	}
	return out
}

func tcp(port int32) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromInt32(port))}
}

func named(name string) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromString(name))}
}

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
)

// The cluster every case runs against: node-a holds default/web,
// default/db and prod/worker; the other pods are elsewhere or are not
// live.
var (
	testNamespaces = []*corev1.Namespace{
		namespace("default", nil),
		namespace("prod", map[string]string{"team": "a"}),
		namespace("dev", map[string]string{"team": "b"}),
	}
	testPods = []*corev1.Pod{
		pod("default", "web", "10.42.0.10", node, map[string]string{"app": "web"}, ports(
			corev1.ContainerPort{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
			corev1.ContainerPort{Name: "dns", ContainerPort: 5353, Protocol: corev1.ProtocolUDP})),
		pod("default", "db", "10.42.0.11", node, map[string]string{"app": "db"}, ports(
			corev1.ContainerPort{Name: "pg", ContainerPort: 5432})), // protocol unset: TCP
		pod("default", "client", "10.42.1.5", "node-b", map[string]string{"app": "client"}),
		pod("prod", "api", "10.42.1.6", "node-b", map[string]string{"app": "api"}, ports(
			corev1.ContainerPort{Name: "http", ContainerPort: 9090, Protocol: corev1.ProtocolTCP})),
		pod("prod", "worker", "10.42.0.12", node, map[string]string{"app": "worker"}),
		pod("dev", "api", "10.42.2.7", "node-c", map[string]string{"app": "api"}, ports(
			corev1.ContainerPort{Name: "http", ContainerPort: 8081, Protocol: corev1.ProtocolTCP})),
		// Not live: never targets, never peers.
		pod("default", "host", "192.168.0.5", node, map[string]string{"app": "web"}, func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
		pod("default", "done", "10.42.0.13", node, map[string]string{"app": "web"}, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
		pod("default", "failed", "10.42.0.14", node, map[string]string{"app": "web"}, func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
		pod("default", "pending", "", node, map[string]string{"app": "web"}, func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }),
	}
)

func TestCompile(t *testing.T) {
	web, db, worker := addrs("10.42.0.10")[0], addrs("10.42.0.11")[0], addrs("10.42.0.12")[0]
	for _, tc := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		want     Ruleset
	}{
		{name: "no policies", want: Ruleset{}},
		{
			name: "default deny ingress: local live pods of the namespace share a chain without rules",
			policies: []*networkingv1.NetworkPolicy{policy("default", "deny", networkingv1.NetworkPolicySpec{
				PolicyTypes: ingressOnly,
			})},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{web, db}}}},
		},
		{
			name: "a policy of another namespace does not apply",
			policies: []*networkingv1.NetworkPolicy{policy("dev", "deny", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "web"}), PolicyTypes: ingressOnly,
			})},
			want: Ruleset{},
		},
		{
			name: "allow from a podSelector: peers on other nodes count, pods that are not live do not",
			policies: []*networkingv1.NetworkPolicy{policy("default", "db", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "db"}),
				Ingress: []networkingv1.NetworkPolicyIngressRule{
					{From: []networkingv1.NetworkPolicyPeer{{PodSelector: selects(map[string]string{"app": "web"})}}},
					{From: []networkingv1.NetworkPolicyPeer{{PodSelector: selects(map[string]string{"app": "client"})}}},
				},
			})},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{db}, Rules: []Rule{
				{Peers: ranges("10.42.0.10")},
				{Peers: ranges("10.42.1.5")},
			}}}},
		},
		{
			name: "a podSelector alone selects in the policy's namespace",
			policies: []*networkingv1.NetworkPolicy{policy("prod", "worker", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "worker"}),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					{PodSelector: selects(map[string]string{"app": "api"})},
				}}},
			})},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{worker}, Rules: []Rule{{Peers: ranges("10.42.1.6")}}}}},
		},
		{
			name: "namespaceSelector alone: every pod of the namespaces",
			policies: []*networkingv1.NetworkPolicy{policy("default", "web", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "web"}),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					{NamespaceSelector: selects(map[string]string{"team": "a"})},
				}}},
			})},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{web}, Rules: []Rule{{Peers: ranges("10.42.0.12", "10.42.1.6")}}}}},
		},
		{
			name: "podSelector and namespaceSelector together",
			policies: []*networkingv1.NetworkPolicy{policy("default", "web", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "web"}),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
						{Key: "team", Operator: metav1.LabelSelectorOpExists},
					}},
					PodSelector: selects(map[string]string{"app": "api"}),
				}}}},
			})},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{web}, Rules: []Rule{{Peers: ranges("10.42.1.6", "10.42.2.7")}}}}},
		},
		{
			name: "ipBlocks of both families with except",
			policies: []*networkingv1.NetworkPolicy{policy("default", "web", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "web"}),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.42.0.0/16", "10.99.0.0/24"}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/8", Except: []string{"fd42::/16"}}},
				}}},
			})},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{web}, Rules: []Rule{{Peers: ranges(
				"10.0.0.0-10.41.255.255", "10.43.0.0-10.98.255.255", "10.99.1.0-10.255.255.255",
				"fd00::-fd41:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fd43::-fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}}}}},
		},
		{
			name: "only IPv6 peers",
			policies: []*networkingv1.NetworkPolicy{policy("default", "web", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "web"}),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/8"}},
				}}},
			})},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{web}, Rules: []Rule{{Peers: ranges("fd00::-fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}}}}},
		},
		{
			name: "an ipBlock that does not parse allows nothing",
			policies: []*networkingv1.NetworkPolicy{policy("default", "web", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "web"}),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/129"}},
				}}},
			})},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{web}}}},
		},
		{
			name: "egress to a port of any address",
			policies: []*networkingv1.NetworkPolicy{policy("default", "db", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "db"}),
				PolicyTypes: egressOnly,
				Egress: []networkingv1.NetworkPolicyEgressRule{{
					To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))}},
				}},
			})},
			want: Ruleset{Egress: []Chain{{Pods: []netip.Addr{db}, Rules: []Rule{
				{Peers: ranges("0.0.0.0-255.255.255.255"), Protocol: unix.IPPROTO_UDP, FirstPort: 53, LastPort: 53},
			}}}},
		},
		{
			name: "named ingress port: resolved against each target, by name and protocol",
			policies: []*networkingv1.NetworkPolicy{policy("default", "all", networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
					named("http"),
					{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromString("dns"))},
					{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromString("pg"))}, // pg is TCP
				}}},
			})},
			want: Ruleset{Ingress: []Chain{
				{Pods: []netip.Addr{web}, Rules: []Rule{
					{Protocol: unix.IPPROTO_TCP, FirstPort: 8080, LastPort: 8080},
					{Protocol: unix.IPPROTO_UDP, FirstPort: 5353, LastPort: 5353},
				}},
				{Pods: []netip.Addr{db}}, // no such ports: nothing allowed
			}},
		},
		{
			name: "named egress port: resolved against each destination pod, never an ipBlock",
			policies: []*networkingv1.NetworkPolicy{policy("default", "web", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "web"}),
				PolicyTypes: egressOnly,
				Egress: []networkingv1.NetworkPolicyEgressRule{{
					To: []networkingv1.NetworkPolicyPeer{
						{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: selects(map[string]string{"app": "api"})},
						{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24"}},
					},
					Ports: []networkingv1.NetworkPolicyPort{named("http")},
				}},
			})},
			want: Ruleset{Egress: []Chain{{Pods: []netip.Addr{web}, Rules: []Rule{
				{Peers: ranges("10.42.2.7"), Protocol: unix.IPPROTO_TCP, FirstPort: 8081, LastPort: 8081},
				{Peers: ranges("10.42.1.6"), Protocol: unix.IPPROTO_TCP, FirstPort: 9090, LastPort: 9090},
			}}}},
		},
		{
			name: "named egress port to any peer: every live pod with the port",
			policies: []*networkingv1.NetworkPolicy{policy("prod", "worker", networkingv1.NetworkPolicySpec{
				PolicyTypes: egressOnly,
				Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{named("http")}}},
			})},
			want: Ruleset{Egress: []Chain{{Pods: []netip.Addr{worker}, Rules: []Rule{
				{Peers: ranges("10.42.0.10"), Protocol: unix.IPPROTO_TCP, FirstPort: 8080, LastPort: 8080},
				{Peers: ranges("10.42.2.7"), Protocol: unix.IPPROTO_TCP, FirstPort: 8081, LastPort: 8081},
				{Peers: ranges("10.42.1.6"), Protocol: unix.IPPROTO_TCP, FirstPort: 9090, LastPort: 9090},
			}}}},
		},
		{
			name: "endPort, protocols, a protocol without a port",
			policies: []*networkingv1.NetworkPolicy{policy("default", "web", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "web"}),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
					{Port: ptr.To(intstr.FromInt32(8000)), EndPort: ptr.To[int32](8100)},
					{Protocol: ptr.To(corev1.ProtocolSCTP), Port: ptr.To(intstr.FromInt32(9999))},
					{Protocol: ptr.To(corev1.ProtocolUDP)},
					{Protocol: ptr.To(corev1.Protocol("ICMP")), Port: ptr.To(intstr.FromInt32(1))}, // unknown: nothing
				}}},
			})},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{web}, Rules: []Rule{
				{Protocol: unix.IPPROTO_TCP, FirstPort: 8000, LastPort: 8100},
				{Protocol: unix.IPPROTO_UDP},
				{Protocol: unix.IPPROTO_SCTP, FirstPort: 9999, LastPort: 9999},
			}}}},
		},
		{
			name: "peers and ports together; an ingress rule {} allows everything",
			policies: []*networkingv1.NetworkPolicy{
				policy("default", "web", networkingv1.NetworkPolicySpec{
					PodSelector: *selects(map[string]string{"app": "web"}),
					Ingress: []networkingv1.NetworkPolicyIngressRule{{
						From:  []networkingv1.NetworkPolicyPeer{{PodSelector: selects(map[string]string{"app": "client"})}},
						Ports: []networkingv1.NetworkPolicyPort{tcp(80), tcp(443)},
					}},
				}),
				policy("default", "db", networkingv1.NetworkPolicySpec{
					PodSelector: *selects(map[string]string{"app": "db"}),
					Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}, {}},
				}),
			},
			want: Ruleset{Ingress: []Chain{
				{Pods: []netip.Addr{web}, Rules: []Rule{
					{Peers: ranges("10.42.1.5"), Protocol: unix.IPPROTO_TCP, FirstPort: 80, LastPort: 80},
					{Peers: ranges("10.42.1.5"), Protocol: unix.IPPROTO_TCP, FirstPort: 443, LastPort: 443},
				}},
				{Pods: []netip.Addr{db}, Rules: []Rule{{}}},
			}},
		},
		{
			name: "the rules of all policies that select a pod add up",
			policies: []*networkingv1.NetworkPolicy{
				policy("default", "deny", networkingv1.NetworkPolicySpec{PolicyTypes: ingressOnly}),
				policy("default", "web", networkingv1.NetworkPolicySpec{
					PodSelector: *selects(map[string]string{"app": "web"}),
					Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}},
				}),
				policy("default", "web-too", networkingv1.NetworkPolicySpec{
					PodSelector: *selects(map[string]string{"app": "web"}),
					Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(443), tcp(80)}}},
				}),
			},
			want: Ruleset{Ingress: []Chain{
				{Pods: []netip.Addr{web}, Rules: []Rule{
					{Protocol: unix.IPPROTO_TCP, FirstPort: 80, LastPort: 80},
					{Protocol: unix.IPPROTO_TCP, FirstPort: 443, LastPort: 443},
				}},
				{Pods: []netip.Addr{db}},
			}},
		},
		{
			name: "policyTypes unset with egress rules: both directions",
			policies: []*networkingv1.NetworkPolicy{policy("default", "db", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "db"}),
				Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(443)}}},
			})},
			want: Ruleset{
				Ingress: []Chain{{Pods: []netip.Addr{db}}},
				Egress:  []Chain{{Pods: []netip.Addr{db}, Rules: []Rule{{Protocol: unix.IPPROTO_TCP, FirstPort: 443, LastPort: 443}}}},
			},
		},
		{
			name: "policyTypes unset without egress rules: ingress only",
			policies: []*networkingv1.NetworkPolicy{policy("default", "db", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "db"}),
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(5432)}}},
			})},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{db}, Rules: []Rule{{Protocol: unix.IPPROTO_TCP, FirstPort: 5432, LastPort: 5432}}}}},
		},
		{
			name: "policyTypes Egress: its ingress rules are ignored",
			policies: []*networkingv1.NetworkPolicy{policy("default", "db", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "db"}),
				PolicyTypes: egressOnly,
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{}},
			})},
			want: Ruleset{Egress: []Chain{{Pods: []netip.Addr{db}}}},
		},
		{
			name: "an invalid selector selects nothing",
			policies: []*networkingv1.NetworkPolicy{
				policy("default", "bad", networkingv1.NetworkPolicySpec{
					PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Sometimes"}}},
					PolicyTypes: ingressOnly,
				}),
				policy("default", "bad-peer", networkingv1.NetworkPolicySpec{
					PodSelector: *selects(map[string]string{"app": "db"}),
					Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
						{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Sometimes"}}}},
					}}},
				}),
			},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{db}}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Compile(tc.policies, testPods, testNamespaces, node)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Compile =\n%+v\nwant\n%+v", got, tc.want)
			}
			// What Run caches of a pod is enough, and the order of the
			// informers' lists does not matter.
			var trimmed []*corev1.Pod
			for _, p := range testPods {
				tp, _ := TrimPod(p)
				trimmed = append(trimmed, tp.(*corev1.Pod))
			}
			rand.Shuffle(len(trimmed), func(i, j int) { trimmed[i], trimmed[j] = trimmed[j], trimmed[i] })
			policies := slices.Clone(tc.policies)
			slices.Reverse(policies)
			if got := Compile(policies, trimmed, testNamespaces, node); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Compile of trimmed, shuffled pods =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestCompileAddressClaimedTwice(t *testing.T) {
	older := pod("default", "old", "10.42.0.20", node, map[string]string{"app": "old"})
	older.CreationTimestamp = metav1.NewTime(time.Unix(1000, 0))
	newer := pod("default", "new", "10.42.0.20", node, map[string]string{"app": "new"})
	newer.CreationTimestamp = metav1.NewTime(time.Unix(2000, 0))
	pols := []*networkingv1.NetworkPolicy{policy("default", "old", networkingv1.NetworkPolicySpec{
		PodSelector: *selects(map[string]string{"app": "old"}), PolicyTypes: ingressOnly,
	})}
	for _, pods := range [][]*corev1.Pod{{older, newer}, {newer, older}} {
		if got := Compile(pols, pods, nil, node); !reflect.DeepEqual(got, Ruleset{}) {
			t.Errorf("the newer pod holds the address, and no policy selects it: got %+v", got)
		}
	}
}

// A dual-stack cluster: every pod has an address of each family, but one
// that has only IPv6 and one whose status still lists only its PodIP.
var (
	dualPods = []*corev1.Pod{
		pod("default", "web", "10.42.0.10", node, map[string]string{"app": "web"}, alsoIP("fd42::10"), ports(
			corev1.ContainerPort{Name: "http", ContainerPort: 8080})),
		pod("default", "db", "10.42.0.11", node, map[string]string{"app": "db"}, alsoIP("fd42::11")),
		pod("default", "client", "10.42.1.5", "node-b", map[string]string{"app": "client"}, alsoIP("fd42:0:0:1::5")),
		pod("default", "v6only", "fd42:0:0:1::6", "node-b", map[string]string{"app": "client"}),
		pod("default", "v4only", "10.42.0.12", node, map[string]string{"app": "web"}, func(p *corev1.Pod) { p.Status.PodIPs = nil }),
		pod("default", "api", "fd42:0:0:2::7", "node-c", map[string]string{"app": "api"}, alsoIP("10.42.2.7"), ports(
			corev1.ContainerPort{Name: "http", ContainerPort: 8081})),
	}
	dualNamespaces = []*corev1.Namespace{namespace("default", nil)}
)

// alsoIP adds an address to the pod's status.podIPs, after its first: the
// other family's.
func alsoIP(ip string) podOption {
	return func(p *corev1.Pod) { p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip}) }
}

func TestCompileDualStack(t *testing.T) {
	web4, web6, db4, db6, v4only := addrs("10.42.0.10")[0], addrs("fd42::10")[0], addrs("10.42.0.11")[0], addrs("fd42::11")[0], addrs("10.42.0.12")[0]
	for _, tc := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		want     Ruleset
	}{
		{
			name:     "default deny: a pod is isolated by each of its addresses",
			policies: []*networkingv1.NetworkPolicy{policy("default", "deny", networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}})},
			want: Ruleset{
				Ingress: []Chain{{Pods: []netip.Addr{web4, db4, v4only, web6, db6}}},
				Egress:  []Chain{{Pods: []netip.Addr{web4, db4, v4only, web6, db6}}},
			},
		},
		{
			name: "a podSelector peer is matched by each of its addresses",
			policies: []*networkingv1.NetworkPolicy{policy("default", "db", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "db"}),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: selects(map[string]string{"app": "client"})}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(5432)},
				}},
			})},
			want: Ruleset{Ingress: []Chain{{Pods: []netip.Addr{db4, db6}, Rules: []Rule{
				{Peers: ranges("10.42.1.5", "fd42:0:0:1::5-fd42:0:0:1::6"), Protocol: unix.IPPROTO_TCP, FirstPort: 5432, LastPort: 5432},
			}}}},
		},
		{
			name: "named egress port: each address of the destination pods",
			policies: []*networkingv1.NetworkPolicy{policy("default", "web", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "db"}),
				PolicyTypes: egressOnly,
				Egress: []networkingv1.NetworkPolicyEgressRule{{
					To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}},
					Ports: []networkingv1.NetworkPolicyPort{named("http")},
				}},
			})},
			want: Ruleset{Egress: []Chain{{Pods: []netip.Addr{db4, db6}, Rules: []Rule{
				{Peers: ranges("10.42.0.10", "fd42::10"), Protocol: unix.IPPROTO_TCP, FirstPort: 8080, LastPort: 8080},
				{Peers: ranges("10.42.2.7", "fd42:0:0:2::7"), Protocol: unix.IPPROTO_TCP, FirstPort: 8081, LastPort: 8081},
			}}}},
		},
		{
			name: "an IPv6 ipBlock with except beside an IPv4 one",
			policies: []*networkingv1.NetworkPolicy{policy("default", "web", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "web"}),
				PolicyTypes: egressOnly,
				Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
					{IPBlock: &networkingv1.IPBlock{CIDR: "fd42::/48", Except: []string{"fd42:0:0:1::/64", "10.42.0.0/16"}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "10.42.0.0/16", Except: []string{"10.42.1.0/24"}}},
				}}},
			})},
			want: Ruleset{Egress: []Chain{{Pods: []netip.Addr{web4, v4only, web6}, Rules: []Rule{{Peers: ranges(
				"10.42.0.0-10.42.0.255", "10.42.2.0-10.42.255.255",
				"fd42::-fd42::ffff:ffff:ffff:ffff", "fd42:0:0:2::-fd42:0:0:ffff:ffff:ffff:ffff:ffff")}}}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Compile(tc.policies, dualPods, dualNamespaces, node); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Compile =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestPodIPs(t *testing.T) {
	for _, tc := range []struct {
		pod  *corev1.Pod
		want []netip.Addr
	}{
		{pod("default", "dual", "10.42.0.10", node, nil, alsoIP("fd42::10")), addrs("10.42.0.10", "fd42::10")},
		{pod("default", "v6first", "fd42::10", node, nil, alsoIP("10.42.0.10")), addrs("fd42::10", "10.42.0.10")},
		{pod("default", "podIP", "10.42.0.10", node, nil, func(p *corev1.Pod) { p.Status.PodIPs = nil }), addrs("10.42.0.10")},
		{pod("default", "bad", "10.42.0.10", node, nil, alsoIP("not-an-ip")), addrs("10.42.0.10")},
		{pod("default", "none", "", node, nil), nil},
	} {
		if got := podIPs(tc.pod); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("podIPs(%s) = %v, want %v", tc.pod.Name, got, tc.want)
		}
	}
}

func TestCompileIPv6AddressClaimedTwice(t *testing.T) {
	older := pod("default", "old", "10.42.0.20", node, map[string]string{"app": "old"}, alsoIP("fd42::20"))
	older.CreationTimestamp = metav1.NewTime(time.Unix(1000, 0))
	// The new pod has the old one's IPv6 address, and an IPv4 one of its own.
	newer := pod("default", "new", "10.42.0.21", node, map[string]string{"app": "new"}, alsoIP("fd42::20"))
	newer.CreationTimestamp = metav1.NewTime(time.Unix(2000, 0))
	pols := []*networkingv1.NetworkPolicy{policy("default", "old", networkingv1.NetworkPolicySpec{
		PodSelector: *selects(map[string]string{"app": "old"}), PolicyTypes: ingressOnly,
	})}
	want := Ruleset{Ingress: []Chain{{Pods: addrs("10.42.0.20")}}}
	for _, pods := range [][]*corev1.Pod{{older, newer}, {newer, older}} {
		if got := Compile(pols, pods, nil, node); !reflect.DeepEqual(got, want) {
			t.Errorf("the newer pod holds the IPv6 address: got %+v, want %+v", got, want)
		}
	}
}
