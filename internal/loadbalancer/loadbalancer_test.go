package loadbalancer

import (
	"bufio"
	"context"
	"net"
	"slices"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// echoServer answers every line with its name.
func echoServer(t *testing.T, name string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					_, _ = c.Write([]byte(name + "\n"))
				}
			}()
		}
	}()
	return l
}

func ask(t *testing.T, addr string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return ""
	}
	return line[:len(line)-1]
}

func TestForward(t *testing.T) {
	a, b := echoServer(t, "a"), echoServer(t, "b")
	// A port nothing listens on: a server that is away.
	gone, _ := net.Listen("tcp", "127.0.0.1:0")
	down := gone.Addr().String()
	gone.Close()

	lb, err := Start("127.0.0.1:0", []string{down, a.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Stop(t.Context())
	if got := ask(t, lb.Addr()); got != "a" {
		t.Errorf("answered by %q, want a (the first server that answers)", got)
	}
	a.Close()
	lb.SetServers([]string{a.Addr().String(), b.Addr().String()})
	if got := ask(t, lb.Addr()); got != "b" {
		t.Errorf("with a gone, answered by %q, want b", got)
	}
	lb.SetServers([]string{down})
	if got := ask(t, lb.Addr()); got != "" {
		t.Errorf("with no server, answered by %q", got)
	}
}

func TestStartErrors(t *testing.T) {
	if _, err := Start("127.0.0.1:0", nil); err == nil {
		t.Error("no servers: no error")
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	defer l.Close()
	if _, err := Start(l.Addr().String(), []string{"127.0.0.1:1"}); err == nil {
		t.Error("a port in use: no error")
	}
}

// apiserverSlice is an EndpointSlice of the kubernetes Service as the
// apiserver writes it, with name and labels changed by edit.
func apiserverSlice(edit func(*metav1.ObjectMeta), ports []discoveryv1.EndpointPort, endpoints ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "kubernetes",
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		Ports:     ports,
		Endpoints: endpoints,
	}
	edit(&s.ObjectMeta)
	return s
}

func asIs(*metav1.ObjectMeta) {}

func TestServers(t *testing.T) {
	port := func(name string, n int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(n)}
	}
	eps := []*discoveryv1.EndpointSlice{apiserverSlice(asIs, []discoveryv1.EndpointPort{port("https", 6443), port("metrics", 9090)},
		discoveryv1.Endpoint{Addresses: []string{"10.99.0.3"}},
		discoveryv1.Endpoint{Addresses: []string{"10.99.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		discoveryv1.Endpoint{Addresses: []string{"10.99.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
	)}
	if got, want := Servers(eps), []string{"10.99.0.2:6443", "10.99.0.3:6443"}; !slices.Equal(got, want) {
		t.Errorf("Servers = %v, want %v", got, want)
	}
}

// TestServersForged: slices with the kubernetes Service's label that the
// apiserver did not write are not followed.
func TestServersForged(t *testing.T) {
	https := []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](6443)}}
	forged := discoveryv1.Endpoint{Addresses: []string{"10.66.6.6"}}
	for name, edit := range map[string]func(*metav1.ObjectMeta){
		"another name": func(m *metav1.ObjectMeta) { m.Name = "kubernetes-abcde" },
		"generated":    func(m *metav1.ObjectMeta) { m.Name, m.GenerateName = "kubernetes-x7k2p", "kubernetes-" },
		"managed by the mirroring controller": func(m *metav1.ObjectMeta) {
			m.Labels[discoveryv1.LabelManagedBy] = "endpointslicemirroring-controller.k8s.io"
		},
		"managed by the endpointslice controller": func(m *metav1.ObjectMeta) {
			m.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
		},
		"managed by someone": func(m *metav1.ObjectMeta) { m.Labels[discoveryv1.LabelManagedBy] = "" },
		"another namespace":  func(m *metav1.ObjectMeta) { m.Namespace = "kube-system" },
		"another service":    func(m *metav1.ObjectMeta) { m.Labels[discoveryv1.LabelServiceName] = "kubernetes-x" },
	} {
		eps := []*discoveryv1.EndpointSlice{
			apiserverSlice(asIs, https, discoveryv1.Endpoint{Addresses: []string{"10.99.0.2"}}),
			apiserverSlice(edit, https, forged),
		}
		if got, want := Servers(eps), []string{"10.99.0.2:6443"}; !slices.Equal(got, want) {
			t.Errorf("%s: Servers = %v, want %v", name, got, want)
		}
	}
}

// Follow adds the apiservers the cluster publishes ahead of the fallback,
// follows them as they change, and returns nil when ctx ends.
func TestFollow(t *testing.T) {
	https := []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](6443)}}
	kubernetes := func(addrs ...string) *discoveryv1.EndpointSlice {
		return apiserverSlice(asIs, https, discoveryv1.Endpoint{Addresses: addrs})
	}
	// Made by someone allowed to create EndpointSlices in default: the
	// fake client does not filter by field, so the balancer does.
	forged := apiserverSlice(func(m *metav1.ObjectMeta) { m.Name = "kubernetes-forged" }, https,
		discoveryv1.Endpoint{Addresses: []string{"10.66.6.6"}})
	client := fake.NewClientset(kubernetes("10.99.0.2"), forged)
	lb, err := Start("127.0.0.1:0", []string{"10.99.0.9:6443"})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Stop(t.Context())
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- lb.Follow(ctx, client, []string{"kelp.example:6443"}) }()
	servers := func() []string {
		lb.mu.Lock()
		defer lb.mu.Unlock()
		return lb.servers
	}
	waitFor := func(want ...string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !slices.Equal(servers(), want); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("servers %v, want %v", servers(), want)
			}
		}
	}
	waitFor("10.99.0.2:6443", "kelp.example:6443")
	if _, err := client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Update(ctx, kubernetes("10.99.0.2", "10.99.0.3"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("10.99.0.2:6443", "10.99.0.3:6443", "kelp.example:6443")
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Follow = %v, want nil when ctx ends", err)
	}
}
