package proxy

import (
	"context"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

func service(name, ip string, typ corev1.ServiceType, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       corev1.ServiceSpec{ClusterIP: ip, Type: typ, Ports: ports},
	}
}

func slice(svc string, port string, number int32, endpoints ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-x", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(port), Port: ptr.To(number), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   endpoints,
	}
}

// slice6 is slice of IPv6 addresses.
func slice6(svc string, port string, number int32, endpoints ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := slice(svc, port, number, endpoints...)
	s.Name, s.AddressType = svc+"-y", discoveryv1.AddressTypeIPv6
	return s
}

// dualStack gives svc a second ClusterIP, as the API does for a
// PreferDualStack or RequireDualStack Service in a dual-stack cluster.
func dualStack(svc *corev1.Service, second string) *corev1.Service {
	svc.Spec.ClusterIPs = []string{svc.Spec.ClusterIP, second}
	policy := corev1.IPFamilyPolicyPreferDualStack
	svc.Spec.IPFamilyPolicy = &policy
	for _, ip := range svc.Spec.ClusterIPs {
		family := corev1.IPv4Protocol
		if netip.MustParseAddr(ip).Is6() {
			family = corev1.IPv6Protocol
		}
		svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, family)
	}
	return svc
}

func ep(ip string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

// onNode is an endpoint on node with the given conditions.
func onNode(ip, node string, ready, serving, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: ptr.To(node),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(serving), Terminating: ptr.To(terminating)}}
}

func TestPorts(t *testing.T) {
	svcs := []*corev1.Service{
		service("web", "10.43.0.20", corev1.ServiceTypeLoadBalancer, corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}),
		service("api", "10.43.0.5", corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "", Port: 443, Protocol: corev1.ProtocolTCP}),
		service("headless", "None", corev1.ServiceTypeClusterIP, corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP}),
		service("ext", "", corev1.ServiceTypeExternalName),
		service("kube-dns", "10.43.0.10", corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}),
	}
	eps := []*discoveryv1.EndpointSlice{
		// Ready unset counts as ready; not ready is left out; duplicates
		// across slices collapse.
		slice("web", "http", 8080, ep("10.42.0.7", nil), ep("10.42.0.6", ptr.To(true)), ep("10.42.0.9", ptr.To(false))),
		slice("web", "http", 8080, ep("10.42.0.6", ptr.To(true))),
		slice("web", "metrics", 9090, ep("10.42.0.8", nil)), // another port's slice
		slice("api", "", 6443, ep("10.99.0.2", nil)),
	}
	svcs[0].Spec.ExternalIPs = []string{"192.0.2.7"}
	svcs[0].Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.99.0.2"}, {Hostname: "lb.example"}}
	got := Ports(svcs, eps, "node-a", netip.MustParseAddr("10.43.0.10"))
	want := []Port{
		{ClusterIP: netip.MustParseAddr("10.43.0.5"), Protocol: unix.IPPROTO_TCP, Port: 443,
			Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.2:6443")}},
		{ClusterIP: netip.MustParseAddr("10.43.0.20"), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: 30080,
			ExternalIPs: []netip.Addr{netip.MustParseAddr("10.99.0.2"), netip.MustParseAddr("192.0.2.7")},
			Endpoints:   []netip.AddrPort{netip.MustParseAddrPort("10.42.0.6:8080"), netip.MustParseAddrPort("10.42.0.7:8080")}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Ports =\n%+v\nwant\n%+v", got, want)
	}
}

func TestStaleUDPFlows(t *testing.T) {
	ip := netip.MustParseAddr("10.43.0.53")
	ep := netip.MustParseAddrPort
	before := []Port{
		{ClusterIP: ip, Protocol: unix.IPPROTO_UDP, Port: 53, NodePort: 30053, Endpoints: []netip.AddrPort{ep("10.42.0.5:53"), ep("10.42.0.6:53")}},
		{ClusterIP: ip, Protocol: unix.IPPROTO_TCP, Port: 53, Endpoints: []netip.AddrPort{ep("10.42.0.5:53")}},
		{ClusterIP: netip.MustParseAddr("10.43.0.99"), Protocol: unix.IPPROTO_UDP, Port: 9, Endpoints: []netip.AddrPort{ep("10.42.0.9:9")}},
	}
	// 10.42.0.5 is replaced by 10.42.0.7 (TCP has nothing to forget), and
	// the second Service is deleted.
	now := []Port{
		{ClusterIP: ip, Protocol: unix.IPPROTO_UDP, Port: 53, NodePort: 30053, Endpoints: []netip.AddrPort{ep("10.42.0.6:53"), ep("10.42.0.7:53")}},
		{ClusterIP: ip, Protocol: unix.IPPROTO_TCP, Port: 53, Endpoints: []netip.AddrPort{ep("10.42.0.7:53")}},
	}
	got := staleUDPFlows(before, now)
	want := []staleFlow{
		{port: before[0], endpoint: netip.MustParseAddr("10.42.0.5")},
		{port: before[2], endpoint: netip.MustParseAddr("10.42.0.9")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("stale flows %+v, want %+v", got, want)
	}
	if got := staleUDPFlows(nil, now); len(got) != 0 {
		t.Errorf("first sync: %+v", got)
	}
	// Two UDP hostPorts are told apart by their port.
	hostPorts := []Port{
		{Protocol: unix.IPPROTO_UDP, NodePort: 53, Endpoints: []netip.AddrPort{ep("10.42.0.5:53")}},
		{Protocol: unix.IPPROTO_UDP, NodePort: 67, Endpoints: []netip.AddrPort{ep("10.42.0.6:67")}},
	}
	if got := staleUDPFlows(hostPorts, hostPorts); len(got) != 0 {
		t.Errorf("unchanged hostPorts: stale %+v", got)
	}
}

func TestHostPorts(t *testing.T) {
	pod := func(name, ip string, phase corev1.PodPhase, ports ...corev1.ContainerPort) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: ports}}},
			Status:     corev1.PodStatus{PodIP: ip, Phase: phase},
		}
	}
	got := HostPorts([]*corev1.Pod{
		pod("ingress", "10.42.0.5", corev1.PodRunning,
			corev1.ContainerPort{ContainerPort: 8443, HostPort: 443, Protocol: corev1.ProtocolTCP},
			corev1.ContainerPort{ContainerPort: 8080, Protocol: corev1.ProtocolTCP}), // no hostPort
		pod("pending", "", corev1.PodPending, corev1.ContainerPort{ContainerPort: 80, HostPort: 80, Protocol: corev1.ProtocolTCP}),
		pod("dns", "10.42.0.6", corev1.PodRunning, corev1.ContainerPort{ContainerPort: 5353, HostPort: 53, Protocol: corev1.ProtocolUDP}),
		pod("bound", "10.42.0.7", corev1.PodRunning, corev1.ContainerPort{ContainerPort: 8080, HostPort: 8080, HostIP: "192.0.2.1", Protocol: corev1.ProtocolTCP}),
	})
	want := []Port{
		{Protocol: unix.IPPROTO_TCP, Port: 8080, ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.42.0.7:8080")}},
		{Protocol: unix.IPPROTO_TCP, NodePort: 443, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.42.0.5:8443")}},
		{Protocol: unix.IPPROTO_UDP, NodePort: 53, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.42.0.6:5353")}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("HostPorts = %+v, want %+v", got, want)
	}
}

func TestPortsTrafficPolicies(t *testing.T) {
	addrs := func(s ...string) []netip.AddrPort {
		var out []netip.AddrPort
		for _, a := range s {
			out = append(out, netip.MustParseAddrPort(a))
		}
		return out
	}
	http := corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}
	for _, tc := range []struct {
		name      string
		configure func(*corev1.Service)
		endpoints []discoveryv1.Endpoint
		want      Port
	}{
		{
			name: "cluster policies use every ready endpoint",
			endpoints: []discoveryv1.Endpoint{
				onNode("10.42.0.5", "node-a", true, true, false),
				onNode("10.42.1.5", "node-b", true, true, false),
				onNode("10.42.1.6", "node-b", false, false, false), // starting up
			},
			want: Port{Endpoints: addrs("10.42.0.5:8080", "10.42.1.5:8080")},
		},
		{
			name: "external traffic policy Local",
			configure: func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			},
			endpoints: []discoveryv1.Endpoint{
				onNode("10.42.0.5", "node-a", true, true, false),
				onNode("10.42.1.5", "node-b", true, true, false),
			},
			want: Port{Endpoints: addrs("10.42.0.5:8080", "10.42.1.5:8080"), ExternalLocal: true, LocalEndpoints: addrs("10.42.0.5:8080")},
		},
		{
			name: "internal traffic policy Local",
			configure: func(s *corev1.Service) {
				s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
			},
			endpoints: []discoveryv1.Endpoint{
				onNode("10.42.0.5", "node-a", true, true, false),
				onNode("10.42.1.5", "node-b", true, true, false),
			},
			want: Port{Endpoints: addrs("10.42.0.5:8080")},
		},
		{
			name: "terminating endpoints serve only when no ready one is left",
			endpoints: []discoveryv1.Endpoint{
				onNode("10.42.0.5", "node-a", false, true, true),
				onNode("10.42.0.6", "node-a", false, false, true), // no longer serving
				onNode("10.42.1.5", "node-b", true, true, false),
			},
			want: Port{Endpoints: addrs("10.42.1.5:8080")},
		},
		{
			name: "terminating endpoints as the last resort, per policy",
			configure: func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			},
			endpoints: []discoveryv1.Endpoint{
				onNode("10.42.0.5", "node-a", false, true, true),
				onNode("10.42.1.5", "node-b", true, true, false),
			},
			want: Port{Endpoints: addrs("10.42.1.5:8080"), ExternalLocal: true, LocalEndpoints: addrs("10.42.0.5:8080")},
		},
		{
			name: "client IP affinity, default timeout",
			configure: func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			},
			endpoints: []discoveryv1.Endpoint{onNode("10.42.0.5", "node-a", true, true, false)},
			want:      Port{Endpoints: addrs("10.42.0.5:8080"), Affinity: 3 * time.Hour},
		},
		{
			name: "client IP affinity with its timeout",
			configure: func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
			},
			endpoints: []discoveryv1.Endpoint{onNode("10.42.0.5", "node-a", true, true, false)},
			want:      Port{Endpoints: addrs("10.42.0.5:8080"), Affinity: time.Minute},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := service("web", "10.43.0.20", corev1.ServiceTypeNodePort, http)
			if tc.configure != nil {
				tc.configure(svc)
			}
			got := Ports([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{slice("web", "http", 8080, tc.endpoints...)}, "node-a", netip.Addr{})
			want := tc.want
			want.ClusterIP, want.Protocol, want.Port, want.NodePort = netip.MustParseAddr("10.43.0.20"), unix.IPPROTO_TCP, 80, 30080
			if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
				t.Errorf("Ports =\n%+v\nwant\n%+v", got, want)
			}
		})
	}
}

// TestRun follows Run, in a dual-stack cluster, through a new Service and
// a table deleted behind its back, and checks it leaves the tables in
// place.
func TestRun(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		fd := testcluster.NetnsFD(t)
		// Run keeps this thread; the test looks at the namespace from others.
		c, err := nftables.New(nftables.WithNetNSFd(fd))
		if err != nil {
			t.Fatal(err)
		}
		http := corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}
		cidrs := []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16"), netip.MustParsePrefix("fd42::/56")}
		chains := func() int { return countChains(c, cidrs) }
		client := fake.NewClientset(
			dualStack(service("web", "10.43.0.20", corev1.ServiceTypeClusterIP, http), "fd43::20"),
			slice("web", "http", 8080, ep("10.42.0.7", nil)),
			slice6("web", "http", 8080, ep("fd42::7", nil)),
		)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			defer cancel()
			waitFor := func(what string, ok func(chains int) bool) bool {
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
					if ok(chains()) {
						return true
					}
				}
				t.Errorf("%s: never happened; %d chains", what, chains())
				return false
			}
			if !waitFor("the table programmed", func(n int) bool { return n > 0 }) {
				return
			}
			one := chains()
			if _, err := client.CoreV1().Services("default").Create(ctx,
				service("api", "fd43::5", corev1.ServiceTypeClusterIP, http), metav1.CreateOptions{}); err != nil {
				t.Error(err)
				return
			}
			if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx,
				slice6("api", "http", 8080, ep("fd42::8", nil)), metav1.CreateOptions{}); err != nil {
				t.Error(err)
				return
			}
			if !waitFor("a new Service programmed", func(n int) bool { return n > one }) {
				return
			}
			two := chains()
			c.DelTable(&nftables.Table{Name: Table, Family: nftables.TableFamilyIPv6})
			if err := c.Flush(); err != nil {
				t.Error(err)
				return
			}
			waitFor("the deleted table back", func(n int) bool { return n == two })
		}()
		cfg := Config{ClusterCIDRs: cidrs, NodeName: "node-a", Pods: client}
		if err := run(ctx, client, cfg, 50*time.Millisecond); err != nil {
			t.Errorf("run: %v", err)
		}
		// Services keep working while kelp is stopped or restarts.
		if chains() <= 0 {
			t.Error("after run: the table is gone; want it kept")
		}
	})
}

func TestPortsDualStack(t *testing.T) {
	ip := netip.MustParseAddr
	http := corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}
	v4 := slice("web", "http", 8080, onNode("10.42.0.5", "node-a", true, true, false), onNode("10.42.1.5", "node-b", true, true, false))
	v6 := slice6("web", "http", 8080, onNode("fd42::5", "node-a", true, true, false), onNode("fd42:0:0:1::5", "node-b", true, true, false))
	for _, tc := range []struct {
		name      string
		svc       *corev1.Service
		slices    []*discoveryv1.EndpointSlice
		configure func(*corev1.Service)
		skip      netip.Addr
		want      []Port
	}{
		{
			name:   "PreferDualStack: a port per family, each to the endpoints of its family",
			svc:    dualStack(service("web", "10.43.0.20", corev1.ServiceTypeClusterIP, http), "fd43::20"),
			slices: []*discoveryv1.EndpointSlice{v6, v4},
			want: []Port{
				{ClusterIP: ip("10.43.0.20"), Protocol: unix.IPPROTO_TCP, Port: 80, Endpoints: addrPorts("10.42.0.5:8080", "10.42.1.5:8080")},
				{ClusterIP: ip("fd43::20"), Protocol: unix.IPPROTO_TCP, Port: 80, Endpoints: addrPorts("[fd42::5]:8080", "[fd42:0:0:1::5]:8080")},
			},
		},
		{
			name:   "RequireDualStack, IPv6 first: the NodePort, external and load balancer addresses of each family",
			svc:    dualStack(service("web", "fd43::20", corev1.ServiceTypeLoadBalancer, http), "10.43.0.20"),
			slices: []*discoveryv1.EndpointSlice{v4, v6},
			configure: func(s *corev1.Service) {
				s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
				s.Spec.ExternalIPs = []string{"2001:db8::7", "192.0.2.7"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.168.1.10"}, {IP: "2001:db8:1::10"}, {Hostname: "lb.example"}}
			},
			want: []Port{
				{ClusterIP: ip("10.43.0.20"), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: 30080,
					ExternalIPs: []netip.Addr{ip("192.0.2.7"), ip("192.168.1.10")}, Endpoints: addrPorts("10.42.0.5:8080", "10.42.1.5:8080")},
				{ClusterIP: ip("fd43::20"), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: 30080,
					ExternalIPs: []netip.Addr{ip("2001:db8::7"), ip("2001:db8:1::10")}, Endpoints: addrPorts("[fd42::5]:8080", "[fd42:0:0:1::5]:8080")},
			},
		},
		{
			name:   "IPv6 only: the IPv4 slices are not its",
			svc:    service("web", "fd43::20", corev1.ServiceTypeNodePort, http),
			slices: []*discoveryv1.EndpointSlice{v4, v6},
			want: []Port{
				{ClusterIP: ip("fd43::20"), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: 30080, Endpoints: addrPorts("[fd42::5]:8080", "[fd42:0:0:1::5]:8080")},
			},
		},
		{
			name:   "a family without endpoints refuses, the other serves",
			svc:    dualStack(service("web", "10.43.0.20", corev1.ServiceTypeClusterIP, http), "fd43::20"),
			slices: []*discoveryv1.EndpointSlice{v4},
			want: []Port{
				{ClusterIP: ip("10.43.0.20"), Protocol: unix.IPPROTO_TCP, Port: 80, Endpoints: addrPorts("10.42.0.5:8080", "10.42.1.5:8080")},
				{ClusterIP: ip("fd43::20"), Protocol: unix.IPPROTO_TCP, Port: 80},
			},
		},
		{
			name:   "traffic policies and affinity in each family",
			svc:    dualStack(service("web", "10.43.0.20", corev1.ServiceTypeNodePort, http), "fd43::20"),
			slices: []*discoveryv1.EndpointSlice{v4, v6},
			configure: func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			},
			want: []Port{
				{ClusterIP: ip("10.43.0.20"), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: 30080, Endpoints: addrPorts("10.42.0.5:8080", "10.42.1.5:8080"),
					ExternalLocal: true, LocalEndpoints: addrPorts("10.42.0.5:8080"), Affinity: 3 * time.Hour},
				{ClusterIP: ip("fd43::20"), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: 30080, Endpoints: addrPorts("[fd42::5]:8080", "[fd42:0:0:1::5]:8080"),
					ExternalLocal: true, LocalEndpoints: addrPorts("[fd42::5]:8080"), Affinity: 3 * time.Hour},
			},
		},
		{
			name:   "the cluster DNS address is left alone, the other family's is not",
			svc:    dualStack(service("web", "10.43.0.20", corev1.ServiceTypeClusterIP, http), "fd43::20"),
			slices: []*discoveryv1.EndpointSlice{v4, v6},
			skip:   ip("10.43.0.20"),
			want: []Port{
				{ClusterIP: ip("fd43::20"), Protocol: unix.IPPROTO_TCP, Port: 80, Endpoints: addrPorts("[fd42::5]:8080", "[fd42:0:0:1::5]:8080")},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.configure != nil {
				tc.configure(tc.svc)
			}
			got := Ports([]*corev1.Service{tc.svc}, tc.slices, "node-a", tc.skip)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Ports =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestHostPortsDualStack(t *testing.T) {
	pod := func(name string, ports ...corev1.ContainerPort) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: ports}}},
			Status: corev1.PodStatus{PodIP: "10.42.0.5", PodIPs: []corev1.PodIP{{IP: "10.42.0.5"}, {IP: "fd42::5"}},
				Phase: corev1.PodRunning},
		}
	}
	got := HostPorts([]*corev1.Pod{
		pod("everywhere", corev1.ContainerPort{ContainerPort: 8443, HostPort: 443, Protocol: corev1.ProtocolTCP}),
		pod("v6", corev1.ContainerPort{ContainerPort: 8080, HostPort: 8080, HostIP: "2001:db8::1", Protocol: corev1.ProtocolTCP}),
		// Unspecified: every address of that family, as with portmap.
		pod("any6", corev1.ContainerPort{ContainerPort: 53, HostPort: 53, HostIP: "::", Protocol: corev1.ProtocolUDP}),
		pod("any4", corev1.ContainerPort{ContainerPort: 67, HostPort: 67, HostIP: "0.0.0.0", Protocol: corev1.ProtocolUDP}),
	})
	want := []Port{
		{Protocol: unix.IPPROTO_TCP, Port: 8080, ExternalIPs: []netip.Addr{netip.MustParseAddr("2001:db8::1")}, Endpoints: addrPorts("[fd42::5]:8080")},
		{Protocol: unix.IPPROTO_TCP, NodePort: 443, Endpoints: addrPorts("10.42.0.5:8443")},
		{Protocol: unix.IPPROTO_TCP, NodePort: 443, Endpoints: addrPorts("[fd42::5]:8443")},
		{Protocol: unix.IPPROTO_UDP, NodePort: 53, Endpoints: addrPorts("[fd42::5]:53")},
		{Protocol: unix.IPPROTO_UDP, NodePort: 67, Endpoints: addrPorts("10.42.0.5:67")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("HostPorts =\n%+v\nwant\n%+v", got, want)
	}
	// The hostPorts of the two families are two ports, each in its table.
	for _, f := range families {
		if pl := newPlan(got, f); len(pl.names) != map[*family]int{ipv4: 2, ipv6: 3}[f] {
			t.Errorf("the table of %s holds %v", tableName(f), pl.names)
		}
	}
}

func TestStaleUDPFlowsDualStack(t *testing.T) {
	// A dual-stack pod's UDP hostPort, the same port in each family: one
	// family's endpoint is not the other's stale one.
	hostPorts := []Port{
		{Protocol: unix.IPPROTO_UDP, NodePort: 53, Endpoints: addrPorts("10.42.0.5:53")},
		{Protocol: unix.IPPROTO_UDP, NodePort: 53, Endpoints: addrPorts("[fd42::5]:53")},
	}
	if got := staleUDPFlows(hostPorts, hostPorts); len(got) != 0 {
		t.Errorf("unchanged hostPorts: stale %+v", got)
	}
	svc := Port{ClusterIP: netip.MustParseAddr("fd43::53"), Protocol: unix.IPPROTO_UDP, Port: 53, Endpoints: addrPorts("[fd42::5]:53", "[fd42::6]:53")}
	now := clonePorts([]Port{svc})
	now[0].Endpoints = addrPorts("[fd42::6]:53")
	if got, want := staleUDPFlows([]Port{svc}, now), []staleFlow{{port: svc, endpoint: netip.MustParseAddr("fd42::5")}}; !reflect.DeepEqual(got, want) {
		t.Errorf("stale flows %+v, want %+v", got, want)
	}
}

func TestConfigValidate(t *testing.T) {
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		cidrs []netip.Prefix
		ok    bool
	}{
		{[]netip.Prefix{p("10.42.0.0/16")}, true},
		{[]netip.Prefix{p("fd42::/56")}, true},
		{[]netip.Prefix{p("fd42::/56"), p("10.42.0.0/16")}, true},
		{nil, false},
		{[]netip.Prefix{p("10.42.0.0/16"), p("10.52.0.0/16")}, false},
		{[]netip.Prefix{{}}, false},
	} {
		if err := (Config{ClusterCIDRs: tc.cidrs}).Validate(); (err == nil) != tc.ok {
			t.Errorf("cluster CIDRs %v: %v, want ok %v", tc.cidrs, err, tc.ok)
		}
	}
}
