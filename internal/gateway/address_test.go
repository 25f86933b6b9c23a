package gateway

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/kelp-dev/kelp/internal/config"
)

func ranges(t *testing.T, values ...string) []config.AddressRange {
	t.Helper()
	r, err := config.ParseAddressRanges("--gateway-address-range", values)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readyNode is a Ready node on the networks 10.0.0.0/24 and fd00::/64, as
// its data path says, with the InternalIPs ip and fd00::1:<ip's last byte>.
func readyNode(name, ip string) *corev1.Node {
	n := node(name, ip, "")
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("fd00::1:%d", netip.MustParseAddr(ip).As4()[3])})
	n.Annotations = map[string]string{NetworksAnnotation: "10.0.0.0/24,fd00::/64"}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	return n
}

func withStatusAddress(gw *gatewayv1.Gateway, ips ...string) *gatewayv1.Gateway {
	for _, ip := range ips {
		gw.Status.Addresses = append(gw.Status.Addresses, gatewayv1.GatewayStatusAddress{Type: ptr(gatewayv1.IPAddressType), Value: ip})
	}
	return gw
}

func withSpecAddress(gw *gatewayv1.Gateway, typ gatewayv1.AddressType, value string) *gatewayv1.Gateway {
	gw.Spec.Addresses = append(gw.Spec.Addresses, gatewayv1.GatewaySpecAddress{Type: ptr(typ), Value: value})
	return gw
}

func aged(gw *gatewayv1.Gateway, age time.Duration) *gatewayv1.Gateway {
	gw.CreationTimestamp = metav1.NewTime(gw.CreationTimestamp.Add(-age))
	return gw
}

func statusAddresses(st gatewayv1.GatewayStatus) []string {
	var out []string
	for _, a := range st.Addresses {
		out = append(out, a.Value)
	}
	return out
}

// Two Gateways with a listener each on port 80 and no hostname get an
// address each from the range, and the data path serves each one's routes
// on its own address only: what the conformance test
// HTTPRouteMultipleGateways asks. A third finds the range used up.
func TestCompileOwnAddresses(t *testing.T) {
	objs := Objects{
		GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()},
		Gateways: []*gatewayv1.Gateway{
			aged(gateway("infra", "a", httpListener("http", 80, "")), 3*time.Hour),
			aged(gateway("infra", "b", httpListener("http", 80, "")), 2*time.Hour),
			aged(gateway("infra", "c", httpListener("http", 80, "")), time.Hour),
		},
		HTTPRoutes: []*gatewayv1.HTTPRoute{
			route("infra", "to-a", 0, parentOf("a"), rule("infra", "svc-a", prefix("/"))),
			route("infra", "to-b", 0, parentOf("b"), rule("infra", "svc-b", prefix("/"))),
		},
		Services:      []*corev1.Service{service("infra", "svc-a"), service("infra", "svc-b")},
		Nodes:         []*corev1.Node{readyNode("n1", "10.0.0.1"), readyNode("n2", "10.0.0.2")},
		AddressRanges: ranges(t, "10.0.0.200-10.0.0.201"),
	}
	cfg, st := Compile(objs)
	a, b, c := st.Gateways[types.NamespacedName{Namespace: "infra", Name: "a"}], st.Gateways[types.NamespacedName{Namespace: "infra", Name: "b"}], st.Gateways[types.NamespacedName{Namespace: "infra", Name: "c"}]
	if got := statusAddresses(a); !slices.Equal(got, []string{"10.0.0.200"}) {
		t.Errorf("Gateway a's addresses %v, want 10.0.0.200", got)
	}
	if got := statusAddresses(b); !slices.Equal(got, []string{"10.0.0.201"}) {
		t.Errorf("Gateway b's addresses %v, want 10.0.0.201", got)
	}
	checkConditions(t, "Gateway a", a.Conditions, 3, condition{"Accepted", true, "Accepted"}, condition{"Programmed", true, "Programmed"})
	checkConditions(t, "Gateway c", c.Conditions, 3, condition{"Accepted", true, "Accepted"}, condition{"Programmed", false, "AddressNotAssigned"})
	if msg := conditionMessage(c.Conditions, "Programmed"); !strings.Contains(msg, "10.0.0.200-10.0.0.201") {
		t.Errorf("Gateway c's Programmed message %q does not name the range", msg)
	}
	checkConditions(t, "Gateway c's listener", c.Listeners[0].Conditions, 3, condition{"Accepted", true, "Accepted"}, condition{"Programmed", false, "Pending"})
	if len(c.Addresses) != 0 {
		t.Errorf("Gateway c has addresses %v without any free", c.Addresses)
	}

	var ports []string
	for _, p := range cfg.Ports {
		var backends []string
		for _, h := range p.Hosts {
			for _, r := range h.Routes {
				backends = append(backends, r.Backends[0].Service)
			}
		}
		ports = append(ports, fmt.Sprintf("%s:%d %v", p.Address, p.Port, backends))
	}
	if want := []string{"10.0.0.200:80 [svc-a]", "10.0.0.201:80 [svc-b]"}; !slices.Equal(ports, want) {
		t.Errorf("data path ports %q, want %q", ports, want)
	}
	if len(cfg.Addresses) != 2 || cfg.Addresses[0].Address != "10.0.0.200" || cfg.Addresses[1].Address != "10.0.0.201" {
		t.Fatalf("held addresses %+v, want 10.0.0.200 and 10.0.0.201", cfg.Addresses)
	}
	for _, h := range cfg.Addresses {
		if h.Node != "n1" && h.Node != "n2" {
			t.Errorf("address %s held by %q, want a node", h.Address, h.Node)
		}
	}
}

func parentOf(gw string) routeOpt {
	return func(r *gatewayv1.HTTPRoute) {
		r.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: gatewayv1.ObjectName(gw)}}
	}
}

func conditionMessage(conds []metav1.Condition, typ string) string {
	for _, c := range conds {
		if c.Type == typ {
			return c.Message
		}
	}
	return ""
}

// A Gateway keeps the addresses its status names, an older one without
// any does not take them; an address a node has is never given; spec.
// addresses are honoured when they can be, and say why not when not.
func TestAssign(t *testing.T) {
	r := ranges(t, "10.0.0.200-10.0.0.203", "fd00::10-fd00::11")
	nodes := []*corev1.Node{readyNode("n1", "10.0.0.1"), readyNode("n2", "10.0.0.200")}
	for _, tc := range []struct {
		name     string
		ranges   []config.AddressRange
		gateways []*gatewayv1.Gateway
		// want: addresses, else "reason" of each Gateway, in order
		want []string
	}{
		{
			name:   "one of each family, skipping a node's address",
			ranges: r,
			gateways: []*gatewayv1.Gateway{
				aged(gateway("ns", "a", httpListener("http", 80, "")), time.Hour),
			},
			want: []string{"10.0.0.201,fd00::10"},
		},
		{
			name:   "status kept, an older Gateway gets the next",
			ranges: r,
			gateways: []*gatewayv1.Gateway{
				aged(gateway("ns", "old", httpListener("http", 80, "")), 2*time.Hour),
				withStatusAddress(aged(gateway("ns", "new", httpListener("http", 80, "")), time.Hour), "10.0.0.201", "fd00::10"),
			},
			want: []string{"10.0.0.202,fd00::11", "10.0.0.201,fd00::10"},
		},
		{
			name:   "a status address outside the ranges is dropped",
			ranges: r,
			gateways: []*gatewayv1.Gateway{
				withStatusAddress(gateway("ns", "a", httpListener("http", 80, "")), "10.0.0.9", "fd00::11"),
			},
			want: []string{"10.0.0.201,fd00::11"},
		},
		{
			name:   "spec.addresses",
			ranges: r,
			gateways: []*gatewayv1.Gateway{
				aged(withSpecAddress(gateway("ns", "asks", httpListener("http", 80, "")), gatewayv1.IPAddressType, "10.0.0.203"), 5*time.Hour),
				aged(withSpecAddress(gateway("ns", "taken", httpListener("http", 80, "")), gatewayv1.IPAddressType, "10.0.0.203"), 4*time.Hour),
				aged(withSpecAddress(gateway("ns", "outside", httpListener("http", 80, "")), gatewayv1.IPAddressType, "10.0.0.9"), 3*time.Hour),
				aged(withSpecAddress(gateway("ns", "hostname", httpListener("http", 80, "")), gatewayv1.HostnameAddressType, "gw.example"), 2*time.Hour),
				aged(withSpecAddress(gateway("ns", "any", httpListener("http", 80, "")), gatewayv1.IPAddressType, ""), time.Hour),
			},
			want: []string{"10.0.0.203", "AddressNotUsable", "AddressNotUsable", "unsupported", "10.0.0.201,fd00::10"},
		},
		{
			name: "spec.addresses without ranges",
			gateways: []*gatewayv1.Gateway{
				withSpecAddress(gateway("ns", "asks", httpListener("http", 80, "")), gatewayv1.IPAddressType, "10.0.0.203"),
			},
			want: []string{"AddressNotAssigned"},
		},
		{
			name:   "all or nothing: no IPv6 left",
			ranges: ranges(t, "10.0.0.201-10.0.0.202", "fd00::10"),
			gateways: []*gatewayv1.Gateway{
				aged(gateway("ns", "a", httpListener("http", 80, "")), 2*time.Hour),
				aged(gateway("ns", "b", httpListener("http", 80, "")), time.Hour),
			},
			want: []string{"10.0.0.201,fd00::10", "AddressNotAssigned"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := assign(tc.ranges, tc.gateways, nodes)
			for i, gw := range tc.gateways {
				a := got[nameOf(gw)]
				var s []string
				for _, ip := range a.addrs {
					s = append(s, ip.String())
				}
				desc := strings.Join(s, ",")
				if a.unsupported != "" {
					desc = "unsupported"
				} else if a.reason != "" {
					desc = a.reason
					if a.msg == "" {
						t.Errorf("Gateway %s: reason %s without a message", gw.Name, a.reason)
					}
				}
				if desc != tc.want[i] {
					t.Errorf("Gateway %s: %s (%s), want %s", gw.Name, desc, a.msg, tc.want[i])
				}
			}
		})
	}
}

// Only Ready, schedulable nodes not excluded from load balancers, on the
// address's network (a node of an earlier kelp does not say) hold
// addresses; a node that holds one keeps it while it may; else a node
// that joins takes only addresses from the others, as many as its share.
func TestHolder(t *testing.T) {
	notReady := readyNode("not-ready", "10.0.0.3")
	notReady.Status.Conditions[0].Status = corev1.ConditionUnknown
	cordoned := readyNode("cordoned", "10.0.0.4")
	cordoned.Spec.Unschedulable = true
	excluded := readyNode("excluded", "10.0.0.5")
	excluded.Labels = map[string]string{corev1.LabelNodeExcludeBalancers: ""}
	elsewhere := readyNode("elsewhere", "192.168.5.5")
	elsewhere.Annotations[NetworksAnnotation] = "192.168.5.0/24,fd00:1::/64"
	unsaid := readyNode("unsaid", "10.0.0.8")
	delete(unsaid.Annotations, NetworksAnnotation)
	unfit := []*corev1.Node{notReady, cordoned, excluded, elsewhere, unsaid, node("no-conditions", "10.0.0.6", "")}
	if n, ok := chooseHolder(netip.MustParseAddr("10.0.0.200"), unfit, ""); ok {
		t.Errorf("%s holds an address", n)
	}
	two := append(slices.Clone(unfit), readyNode("n1", "10.0.0.1"), readyNode("n2", "10.0.0.2"))
	three := append(slices.Clone(two), readyNode("n3", "10.0.0.7"))
	count := map[string]int{}
	ip := netip.MustParseAddr("10.0.0.100")
	for range 60 {
		ip = ip.Next()
		before, ok := chooseHolder(ip, two, "")
		if !ok || (before != "n1" && before != "n2") {
			t.Fatalf("%s held by %q of two Ready nodes", ip, before)
		}
		after, _ := chooseHolder(ip, three, "")
		if after != before && after != "n3" {
			t.Errorf("%s moved from %s to %s when n3 joined", ip, before, after)
		}
		count[after]++
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		if count[n] < 10 {
			t.Errorf("node %s holds %d of 60 addresses, want about a third: %v", n, count[n], count)
		}
	}

	// The node that holds an address keeps it while it may.
	for _, was := range []string{"n1", "n2", "n3"} {
		if got, _ := chooseHolder(ip, three, was); got != was {
			t.Errorf("%s held by %s went to %s", ip, was, got)
		}
	}
	if got, _ := chooseHolder(ip, three, "cordoned"); got == "cordoned" {
		t.Errorf("%s stayed on a cordoned node", ip)
	}
}

// What a node says of itself makes only that node hold an address or
// not: a network counts only if it holds the node's own InternalIP or
// ExternalIP, a node's own address is never given to it, and a node that
// found an address in use on its network does not hold it, while another
// node that may takes it.
func TestHolderSelfReported(t *testing.T) {
	ip := netip.MustParseAddr("10.0.0.200")
	liar := readyNode("liar", "192.168.5.5")
	liar.Annotations[NetworksAnnotation] = "10.0.0.0/24,192.168.5.0/24"
	if n, ok := chooseHolder(ip, []*corev1.Node{liar}, ""); ok {
		t.Errorf("%s holds %s on a network that does not hold its address", n, ip)
	}
	if n, ok := chooseHolder(netip.MustParseAddr("10.0.0.1"), []*corev1.Node{readyNode("n1", "10.0.0.1")}, ""); ok {
		t.Errorf("%s is given its own address", n)
	}
	external := readyNode("external", "192.168.5.6")
	external.Status.Addresses = append(external.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "10.0.0.6"})
	if n, _ := chooseHolder(ip, []*corev1.Node{external}, ""); n != "external" {
		t.Errorf("a node whose ExternalIP is on the address's network: holder %q", n)
	}

	n1, n2 := readyNode("n1", "10.0.0.1"), readyNode("n2", "10.0.0.2")
	was, _ := chooseHolder(ip, []*corev1.Node{n1, n2}, "")
	found, other := n1, n2
	if was == "n2" {
		found, other = n2, n1
	}
	found.Annotations[InUseAnnotation] = "10.0.0.9," + ip.String()
	if got, _ := chooseHolder(ip, []*corev1.Node{n1, n2}, was); got != other.Name {
		t.Errorf("%s found %s in use: holder %q, want %s", found.Name, ip, got, other.Name)
	}
	if n, ok := chooseHolder(ip, []*corev1.Node{found}, was); ok {
		t.Errorf("%s holds %s it found in use", n, ip)
	}
}

// An address in use on the network is given to no Gateway once every node
// that may hold it found it so: a Gateway that had it gets another; one
// that asked for it is told. What one node of two found changes nothing.
func TestAssignInUse(t *testing.T) {
	r := ranges(t, "10.0.0.200-10.0.0.203")
	had := withStatusAddress(aged(gateway("ns", "had", httpListener("http", 80, "")), time.Hour), "10.0.0.200")
	asked := withSpecAddress(gateway("ns", "asked", httpListener("http", 80, "")), gatewayv1.IPAddressType, "10.0.0.201")
	gateways := []*gatewayv1.Gateway{had, asked}
	n1, n2 := readyNode("n1", "10.0.0.1"), readyNode("n2", "10.0.0.2")
	n1.Annotations[InUseAnnotation] = "10.0.0.200,10.0.0.201"
	got := assign(r, gateways, []*corev1.Node{n1, n2})
	if a := got[nameOf(had)]; !slices.Equal(a.addrs, []netip.Addr{netip.MustParseAddr("10.0.0.200")}) {
		t.Errorf("one node of two found it in use: Gateway had got %v %s", a.addrs, a.msg)
	}
	if a := got[nameOf(asked)]; !slices.Equal(a.addrs, []netip.Addr{netip.MustParseAddr("10.0.0.201")}) {
		t.Errorf("one node of two found it in use: Gateway asked got %v %s", a.addrs, a.msg)
	}

	n2.Annotations[InUseAnnotation] = "10.0.0.201,10.0.0.200"
	got = assign(r, gateways, []*corev1.Node{n1, n2})
	if a := got[nameOf(had)]; !slices.Equal(a.addrs, []netip.Addr{netip.MustParseAddr("10.0.0.202")}) {
		t.Errorf("every node found it in use: Gateway had got %v, want 10.0.0.202", a.addrs)
	}
	a := got[nameOf(asked)]
	if len(a.addrs) > 0 || a.reason != string(gatewayv1.GatewayReasonAddressNotUsable) || !strings.Contains(a.msg, "another machine on its network, as nodes n1, n2 found") {
		t.Errorf("every node found it in use: Gateway asked got %v %s: %s", a.addrs, a.reason, a.msg)
	}
}

// A Gateway whose address the only node that may hold it found in use
// moves to another address; one that asked for that address is told why
// it is not Programmed, naming the node.
func TestCompileAddressInUse(t *testing.T) {
	n1 := readyNode("n1", "10.0.0.1")
	n1.Annotations[InUseAnnotation] = "10.0.0.200"
	n2 := readyNode("n2", "10.0.0.2")
	n2.Status.Conditions[0].Status = corev1.ConditionFalse
	had := withStatusAddress(aged(gateway("infra", "had", httpListener("http", 8080, "")), time.Hour), "10.0.0.200")
	asked := withSpecAddress(gateway("infra", "asked", httpListener("http", 8080, "")), gatewayv1.IPAddressType, "10.0.0.200")
	cfg, st := Compile(Objects{GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()}, Gateways: []*gatewayv1.Gateway{had, asked}, Nodes: []*corev1.Node{n1, n2}, AddressRanges: ranges(t, "10.0.0.200-10.0.0.203")})
	if want := []HeldAddress{{Address: "10.0.0.201", Node: "n1"}}; !slices.Equal(cfg.Addresses, want) {
		t.Errorf("held %v, want %v", cfg.Addresses, want)
	}
	gst := st.Gateways[nameOf(had)]
	if got := statusAddresses(gst); !slices.Equal(got, []string{"10.0.0.201"}) {
		t.Errorf("Gateway had: addresses %v, want 10.0.0.201", got)
	}
	checkConditions(t, "Gateway had", gst.Conditions, had.Generation, condition{"Programmed", true, "Programmed"})
	gst = st.Gateways[nameOf(asked)]
	checkConditions(t, "Gateway asked", gst.Conditions, asked.Generation, condition{"Programmed", false, "AddressNotUsable"})
	if c := apimeta.FindStatusCondition(gst.Conditions, "Programmed"); c == nil || !strings.Contains(c.Message, "10.0.0.200 is in use by another machine on its network, as node n1 found") {
		t.Errorf("Gateway asked: Programmed says %v", c)
	}
}

// The conformance test GatewayStaticAddresses: a Gateway asking for an
// address of an unsupported type is not Accepted; asking for one outside
// the range it is Accepted but not Programmed, AddressNotUsable; asking
// for one of the range it is Programmed there, with that one address.
func TestCompileStaticAddresses(t *testing.T) {
	r := ranges(t, "10.0.0.200-10.0.0.203")
	nodes := []*corev1.Node{readyNode("n1", "10.0.0.1")}
	status := func(addresses ...gatewayv1.GatewaySpecAddress) gatewayv1.GatewayStatus {
		gw := gateway("infra", "static", httpListener("http", 8080, ""))
		gw.Spec.Addresses = addresses
		_, st := Compile(Objects{GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()}, Gateways: []*gatewayv1.Gateway{gw}, Nodes: nodes, AddressRanges: r})
		return st.Gateways[nameOf(gw)]
	}
	invalid := gatewayv1.GatewaySpecAddress{Type: ptr(gatewayv1.AddressType("test/fake-invalid-type")), Value: "fake address teehee!"}
	unusable := gatewayv1.GatewaySpecAddress{Type: ptr(gatewayv1.IPAddressType), Value: "10.0.0.9"}
	usable := gatewayv1.GatewaySpecAddress{Type: ptr(gatewayv1.IPAddressType), Value: "10.0.0.202"}

	st := status(invalid, unusable, usable)
	checkConditions(t, "with an invalid address", st.Conditions, 3, condition{"Accepted", false, "UnsupportedAddress"})
	st = status(unusable, usable)
	checkConditions(t, "with an unusable address", st.Conditions, 3, condition{"Accepted", true, "Accepted"}, condition{"Programmed", false, "AddressNotUsable"})
	if msg := conditionMessage(st.Conditions, "Programmed"); !strings.Contains(msg, "10.0.0.9 is not in") {
		t.Errorf("Programmed message %q does not say which address is wrong", msg)
	}
	st = status(usable)
	checkConditions(t, "with a usable address", st.Conditions, 3, condition{"Accepted", true, "Accepted"}, condition{"Programmed", true, "Programmed"})
	if got := statusAddresses(st); !slices.Equal(got, []string{"10.0.0.202"}) {
		t.Errorf("addresses %v, want 10.0.0.202", got)
	}
}
