package servicelb

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kelp-dev/kelp/internal/informer/informertest"
)

// node is a node with InternalIPs ips (comma-separated).
func node(name, ips string, ready bool, labels map[string]string) *corev1.Node {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}},
		},
	}
	for _, ip := range strings.Split(ips, ",") {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	return n
}

func ips(in []corev1.LoadBalancerIngress) []string {
	var out []string
	for _, i := range in {
		out = append(out, i.IP)
	}
	return out
}

func TestIngress(t *testing.T) {
	enabled := map[string]string{EnableLabel: "true"}
	v4 := []corev1.IPFamily{corev1.IPv4Protocol}
	v6 := []corev1.IPFamily{corev1.IPv6Protocol}
	dual := []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	dualV6First := []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	dualNodes := []*corev1.Node{node("b", "10.0.0.2,fd00::2", true, nil), node("a", "fd00::1,10.0.0.1", true, nil), node("c", "10.0.0.3", true, nil)}
	for _, tc := range []struct {
		name     string
		nodes    []*corev1.Node
		families []corev1.IPFamily
		want     []string
	}{
		{"every ready node", []*corev1.Node{node("b", "10.0.0.2", true, nil), node("a", "10.0.0.1", true, nil), node("c", "10.0.0.3", false, nil)}, v4, []string{"10.0.0.1", "10.0.0.2"}},
		{"only labelled nodes once one is", []*corev1.Node{node("a", "10.0.0.1", true, nil), node("b", "10.0.0.2", true, enabled)}, v4, []string{"10.0.0.2"}},
		{"no node", nil, v4, nil},
		{"an IPv4 Service gets no IPv6 address", dualNodes, v4, []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}},
		{"an IPv6 Service gets the nodes' IPv6 addresses", dualNodes, v6, []string{"fd00::1", "fd00::2"}},
		{"a dual-stack Service gets both, its primary family's first", dualNodes, dual, []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1", "fd00::2"}},
		{"IPv6 primary", dualNodes, dualV6First, []string{"fd00::1", "fd00::2", "10.0.0.1", "10.0.0.2", "10.0.0.3"}},
		{"an IPv6 Service where no node has IPv6", []*corev1.Node{node("a", "10.0.0.1", true, nil)}, v6, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ips(Ingress(tc.nodes, tc.families)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ingress %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFamilies(t *testing.T) {
	svc := func(spec corev1.ServiceSpec) *corev1.Service { return &corev1.Service{Spec: spec} }
	for _, tc := range []struct {
		svc  *corev1.Service
		want []corev1.IPFamily
	}{
		{svc(corev1.ServiceSpec{IPFamilies: []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}, ClusterIPs: []string{"fd43::1", "10.43.0.1"}}), []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}},
		{svc(corev1.ServiceSpec{ClusterIPs: []string{"10.43.0.1", "fd43::1"}}), []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}},
		{svc(corev1.ServiceSpec{ClusterIP: "fd43::1"}), []corev1.IPFamily{corev1.IPv6Protocol}},
		{svc(corev1.ServiceSpec{}), []corev1.IPFamily{corev1.IPv4Protocol}},
	} {
		if got := Families(tc.svc); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Families(%+v) = %v, want %v", tc.svc.Spec, got, tc.want)
		}
	}
}

// TestRun checks that Run gives each LoadBalancer Service the node
// addresses of its own families.
func TestRun(t *testing.T) {
	lb := func(name string, families ...corev1.IPFamily) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, IPFamilies: families}}
	}
	client := fake.NewClientset(
		node("a", "10.0.0.1,fd00::1", true, nil), node("b", "10.0.0.2,fd00::2", true, nil),
		lb("v4", corev1.IPv4Protocol), lb("v6", corev1.IPv6Protocol), lb("dual", corev1.IPv6Protocol, corev1.IPv4Protocol))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, client, informertest.Cache(t, client, nil)) }()
	want := map[string][]string{
		"v4":   {"10.0.0.1", "10.0.0.2"},
		"v6":   {"fd00::1", "fd00::2"},
		"dual": {"fd00::1", "fd00::2", "10.0.0.1", "10.0.0.2"},
	}
	got := map[string][]string{}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for name := range want {
			svc, err := client.CoreV1().Services("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got[name] = ips(svc.Status.LoadBalancer.Ingress)
		}
		if reflect.DeepEqual(got, want) {
			break
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ingress %v, want %v", got, want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
