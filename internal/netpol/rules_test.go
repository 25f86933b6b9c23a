package netpol

import (
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// setElements counts the elements of each set of the table. It fails the
// test but does not stop it: TestRun calls it from another goroutine.
func setElements(t *testing.T, c *nftables.Conn) map[string]int {
	t.Helper()
	out := map[string]int{}
	sets, err := c.GetSets(inet)
	if err != nil {
		t.Error(err)
		return out
	}
	for _, s := range sets {
		elems, err := c.GetSetElements(s)
		if err != nil {
			t.Errorf("elements of %s: %v", s.Name, err)
		}
		out[s.Name] = len(elems)
	}
	return out
}

// inet is the table Apply programs.
var inet = &nftables.Table{Name: Table, Family: nftables.TableFamilyINet}

// addLegacyTable makes the table of a kelp before dual-stack, with a chain
// that drops forwarded packets.
func addLegacyTable(t *testing.T, c *nftables.Conn) {
	t.Helper()
	lt := c.AddTable(&nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4})
	c.AddChain(&nftables.Chain{Name: "forward", Table: lt, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// tableNames are the tables of the namespace, as "family name". Like
// setElements, it fails the test but does not stop it.
func tableNames(t *testing.T, c *nftables.Conn) []string {
	t.Helper()
	tables, err := c.ListTables()
	if err != nil {
		t.Error(err)
	}
	var out []string
	for _, tb := range tables {
		out = append(out, fmt.Sprintf("%d %s", tb.Family, tb.Name))
	}
	return out
}

func TestApplyProgramsTheKernel(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		everyoneElse := ranges("10.42.1.5", "10.42.2.0-10.42.2.255", "fd42:0:0:1::5")
		r := Ruleset{
			Ingress: []Chain{
				{Pods: addrs("10.42.0.10", "10.42.0.11", "fd42::10"), Rules: []Rule{
					{Protocol: unix.IPPROTO_TCP, FirstPort: 8000, LastPort: 8100}, // one rule for both families
					{Peers: everyoneElse, Protocol: unix.IPPROTO_TCP, FirstPort: 80, LastPort: 80},
					{Peers: everyoneElse, Protocol: unix.IPPROTO_UDP},
					{Peers: ranges("0.0.0.0-9.255.255.255", "11.0.0.0-255.255.255.255")},
					{Peers: ranges("fd00::-fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")},
				}},
				{Pods: addrs("10.42.0.12", "fd42::12")},
			},
			Egress: []Chain{{Pods: addrs("10.42.0.11", "fd42::11"), Rules: []Rule{
				{Peers: ranges("10.43.0.10", "fd43::a"), Protocol: unix.IPPROTO_UDP, FirstPort: 53, LastPort: 53},
				{Protocol: unix.IPPROTO_SCTP, FirstPort: 9999, LastPort: 9999},
			}}},
		}
		// A node upgraded from a kelp before dual-stack: its first apply
		// removes the old table.
		addLegacyTable(t, c)
		if err := apply(c, Ruleset{Ingress: []Chain{{Pods: addrs("10.42.0.99")}}}, true); err != nil {
			t.Fatal(err)
		}
		if got, want := tableNames(t, c), []string{fmt.Sprintf("%d %s", nftables.TableFamilyINet, Table)}; !reflect.DeepEqual(got, want) {
			t.Fatalf("tables after the first apply %v, want %v", got, want)
		}
		// The second apply replaces the first, and a third the second.
		for _, r := range []Ruleset{{}, r} {
			if err := Apply(c, r); err != nil {
				t.Fatal(err)
			}
		}
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
		if err != nil {
			t.Fatal(err)
		}
		rules := map[string]int{}
		for _, ch := range chains {
			got, err := c.GetRules(ch.Table, ch)
			if err != nil {
				t.Fatal(err)
			}
			rules[ch.Name] = len(got)
		}
		// A rule with peers of both families is a rule for each.
		wantRules := map[string]int{"forward": 6, "ingress-0": 8, "ingress-1": 1, "egress-0": 4}
		if fmt.Sprint(rules) != fmt.Sprint(wantRules) {
			t.Errorf("rules per chain %v, want %v", rules, wantRules)
		}
		// Peer sets are shared by the rules that name the same peers; an
		// interval ends at the address after it unless it runs to the end.
		wantElems := map[string]int{
			"egress-pods4": 1, "egress-pods6": 1, "ingress-pods4": 3, "ingress-pods6": 2,
			"peers4-0": 2, "peers6-1": 2, "peers4-2": 4, "peers6-3": 2, "peers4-4": 3, "peers6-5": 2,
		}
		if got := setElements(t, c); fmt.Sprint(got) != fmt.Sprint(wantElems) {
			t.Errorf("set elements %v, want %v", got, wantElems)
		}

		if ok, err := intact(c, r); err != nil || !ok {
			t.Errorf("intact after Apply = %v, %v", ok, err)
		}
		if ok, err := intact(c, Ruleset{}); err != nil || ok {
			t.Errorf("intact for another ruleset = %v, %v", ok, err)
		}
		for _, ch := range chains {
			if ch.Name == "ingress-0" {
				got, _ := c.GetRules(ch.Table, ch)
				if err := c.DelRule(got[0]); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if ok, err := intact(c, r); err != nil || ok {
			t.Errorf("intact without a rule = %v, %v", ok, err)
		}

		addLegacyTable(t, c)
		for range 2 { // removing what is gone is no error
			if err := Remove(c); err != nil {
				t.Fatal(err)
			}
		}
		if got := tableNames(t, c); len(got) != 0 {
			t.Errorf("after Remove: tables %v", got)
		}
		if ok, err := intact(c, r); err != nil || ok {
			t.Errorf("intact without the table = %v, %v", ok, err)
		}
	})
}

// podNetns is a pod's network namespace (testcluster.Netns) that tells
// whether it connects.
type podNetns struct{ *testcluster.Netns }

// connects reports whether a TCP connection from p to addr is set up, or
// is dropped (times out).
func (p *podNetns) connects(addr string) (bool, error) {
	var ok bool
	err := p.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			ok = true
			return c.Close()
		}
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		return err
	})
	return ok, err
}

// TestEnforcement puts four dual-stack pods on a bridge, as the CNI bridge
// does, and checks which connections between them the compiled policies
// let through: over IPv6 just those they let through over IPv4.
func TestEnforcement(t *testing.T) {
	// br_netfilter hands bridged packets to the forward hook; it is in
	// the kernel if its sysctls are.
	for _, f := range []string{"iptables", "ip6tables"} {
		if _, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-" + f); err != nil {
			t.Skip("needs br_netfilter")
		}
	}
	testcluster.InNewNetns(t, func() {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := netlink.LinkAdd(br); err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(br); err != nil {
			t.Fatal(err)
		}
		var pods []*corev1.Pod
		netns := map[string]*podNetns{}
		// The addresses of each pod: IPv4 first, IPv6 second.
		ips := map[string][2]string{}
		for i, name := range []string{"a", "b", "c", "d"} {
			ip, ip6 := fmt.Sprintf("10.42.0.%d", 2+i), fmt.Sprintf("fd42::%d", 2+i)
			ips[name] = [2]string{ip, ip6}
			p := &podNetns{testcluster.NewNetns(t)}
			netns[name] = p
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth-" + name, MasterIndex: br.Index}, PeerName: "pod-" + name}); err != nil {
				t.Fatal(err)
			}
			for _, err := range []error{
				linkDo("veth-"+name, netlink.LinkSetUp),
				linkDo("pod-"+name, func(l netlink.Link) error { return netlink.LinkSetNsFd(l, p.FD) }),
				p.Do(func() error {
					if err := linkDo("pod-"+name, func(l netlink.Link) error {
						return testcluster.AddAddrs(l, ip+"/24", ip6+"/64")
					}); err != nil {
						return err
					}
					return linkDo("pod-"+name, netlink.LinkSetUp)
				}),
			} {
				if err != nil {
					t.Fatalf("pod %s: %v", name, err)
				}
			}
			pod := pod("default", name, ip, node, map[string]string{"app": name}, alsoIP(ip6))
			if name == "b" {
				ports(corev1.ContainerPort{Name: "http", ContainerPort: 8080})(pod)
			}
			pods = append(pods, pod)
		}
		for name, ports := range map[string][]int{"a": {8080}, "b": {8080, 9090}, "d": {8080}} {
			for _, port := range ports {
				// A socket of each family: Go decides whether ":port" is
				// both by a probe of the namespace it first listens in.
				for _, network := range []string{"tcp4", "tcp6"} {
					netns[name].Accept(t, network, fmt.Sprintf(":%d", port))
				}
			}
		}

		policies := []*networkingv1.NetworkPolicy{
			policy("default", "b-from-a", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "b"}),
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: selects(map[string]string{"app": "a"})}},
					Ports: []networkingv1.NetworkPolicyPort{named("http")},
				}},
			}),
			policy("default", "b-no-egress", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "b"}),
				PolicyTypes: egressOnly,
			}),
			policy("default", "c-egress", networkingv1.NetworkPolicySpec{
				PodSelector: *selects(map[string]string{"app": "c"}),
				PolicyTypes: egressOnly,
				Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
					{IPBlock: &networkingv1.IPBlock{CIDR: "10.42.0.0/24", Except: []string{"10.42.0.5/32"}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "fd42::/64", Except: []string{"fd42::5/128"}}},
				}}},
			}),
		}
		r := Compile(policies, pods, []*corev1.Namespace{namespace("default", nil)}, node)
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		if err := Apply(c, r); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			from, to string
			port     int
			want     bool
			why      string
		}{
			{"a", "b", 8080, true, "allowed peer and named port; the replies of b, which may not start connections, pass"},
			{"a", "b", 9090, false, "a port the policy does not name"},
			{"d", "b", 8080, false, "a peer the policy does not name"},
			{"b", "a", 8080, false, "b may not start connections"},
			{"c", "a", 8080, true, "c may reach its ipBlock, a is not isolated"},
			{"c", "d", 8080, false, "d is an except of c's ipBlock"},
			{"c", "b", 8080, false, "c may send, but b may not receive from c"},
			{"d", "a", 8080, true, "neither d nor a is isolated"},
		} {
			for family, ip := range ips[tc.to] {
				to := net.JoinHostPort(ip, fmt.Sprint(tc.port))
				got, err := netns[tc.from].connects(to)
				if err != nil {
					t.Errorf("%s -> %s (IPv%d): %v", tc.from, to, 4+2*family, err)
				} else if got != tc.want {
					t.Errorf("%s -> %s (IPv%d) connects = %v, want %v: %s", tc.from, to, 4+2*family, got, tc.want, tc.why)
				}
			}
		}
		if err := Remove(c); err != nil {
			t.Fatal(err)
		}
		for _, to := range []string{"10.42.0.3:8080", "[fd42::3]:8080"} {
			if ok, err := netns["d"].connects(to); err != nil || !ok {
				t.Errorf("without the table d -> %s connects = %v, %v", to, ok, err)
			}
		}
	})
}

// linkDo runs f on the link called name in the thread's namespace.
func linkDo(name string, f func(netlink.Link) error) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return f(l)
}
