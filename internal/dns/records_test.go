package dns

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// fakeAPI answers the lists and watches of CoreDNS's kubernetes plugin
// with lists, keyed by path, that never change, and returns a kubeconfig
// for it. It listens in the namespace of the calling thread.
func fakeAPI(t *testing.T, lists map[string]any) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true":
			// No streaming lists here: client-go falls back to a list.
			http.Error(w, "streaming lists are not served", http.StatusBadRequest)
		case q.Get("watch") == "true":
			// Nothing changes: hold the watch open.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case lists[r.URL.Path] != nil:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(lists[r.URL.Path])
		default:
			t.Logf("fake API: %s %s not served", r.Method, r.URL)
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(func() {
		// CoreDNS may still hold its watches.
		srv.CloseClientConnections()
		srv.Close()
	})
	kubeconfig := filepath.Join(t.TempDir(), "dns.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: %q}}]
users: [{name: dns, user: {}}]
contexts: [{name: fake, context: {cluster: fake, user: dns}}]
current-context: fake
`, srv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

// dualStackCluster is the API of a dual-stack cluster: a Service with a
// ClusterIP of each family, and a headless one whose endpoints have an
// address of each family, in an EndpointSlice per family.
func dualStackCluster() map[string]any {
	list := func(kind string) metav1.TypeMeta { return metav1.TypeMeta{Kind: kind, APIVersion: "v1"} }
	rv := metav1.ListMeta{ResourceVersion: "1"}
	tcp := corev1.ProtocolTCP
	slice := func(name string, family discoveryv1.AddressType, hosts map[string]string) discoveryv1.EndpointSlice {
		s := discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "db"}},
			AddressType: family,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("pg"), Port: ptr(int32(5432)), Protocol: &tcp}},
		}
		for _, host := range slices.Sorted(func(yield func(string) bool) {
			for h := range hosts {
				if !yield(h) {
					return
				}
			}
		}) {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{hosts[host]}, Hostname: ptr(host), Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
		}
		return s
	}
	return map[string]any{
		"/api/v1/namespaces": &corev1.NamespaceList{TypeMeta: list("NamespaceList"), ListMeta: rv, Items: []corev1.Namespace{
			{ObjectMeta: metav1.ObjectMeta{Name: "default"}},
		}},
		"/api/v1/services": &corev1.ServiceList{TypeMeta: list("ServiceList"), ListMeta: rv, Items: []corev1.Service{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}, Spec: corev1.ServiceSpec{
				Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.43.0.20", ClusterIPs: []string{"10.43.0.20", "fd43::20"},
				IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
				IPFamilyPolicy: ptr(corev1.IPFamilyPolicyPreferDualStack),
				Ports:          []corev1.ServicePort{{Name: "http", Port: 80, Protocol: tcp}},
			}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "db"}, Spec: corev1.ServiceSpec{
				Type: corev1.ServiceTypeClusterIP, ClusterIP: corev1.ClusterIPNone, ClusterIPs: []string{corev1.ClusterIPNone},
				IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
				IPFamilyPolicy: ptr(corev1.IPFamilyPolicyRequireDualStack),
				Ports:          []corev1.ServicePort{{Name: "pg", Port: 5432, Protocol: tcp}},
			}},
		}},
		"/apis/discovery.k8s.io/v1/endpointslices": &discoveryv1.EndpointSliceList{
			TypeMeta: metav1.TypeMeta{Kind: "EndpointSliceList", APIVersion: "discovery.k8s.io/v1"}, ListMeta: rv,
			Items: []discoveryv1.EndpointSlice{
				slice("db-v4", discoveryv1.AddressTypeIPv4, map[string]string{"db-0": "10.42.0.5", "db-1": "10.42.1.6"}),
				slice("db-v6", discoveryv1.AddressTypeIPv6, map[string]string{"db-0": "fd42::5", "db-1": "fd42:0:0:1::6"}),
			},
		},
	}
}

func ptr[T any](v T) *T { return &v }

// answers asks server for name's records of type qtype, over UDP from the
// calling thread's namespace, until it has an answer or 10 s passed.
func answers(t *testing.T, server netip.Addr, name string, qtype uint16) []string {
	t.Helper()
	m := new(mdns.Msg)
	m.SetQuestion(mdns.Fqdn(name), qtype)
	var last string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		in, err := mdns.Exchange(m, net.JoinHostPort(server.String(), "53"))
		if err != nil {
			last = err.Error()
			continue
		}
		if in.Rcode != mdns.RcodeSuccess || len(in.Answer) == 0 {
			last = fmt.Sprintf("rcode %s, %d answers", mdns.RcodeToString[in.Rcode], len(in.Answer))
			continue
		}
		var out []string
		for _, rr := range in.Answer {
			switch rr := rr.(type) {
			case *mdns.A:
				out = append(out, rr.A.String())
			case *mdns.AAAA:
				out = append(out, rr.AAAA.String())
			case *mdns.PTR:
				out = append(out, rr.Ptr)
			default:
				out = append(out, rr.String())
			}
		}
		slices.Sort(out)
		return out
	}
	t.Errorf("%s %s at %s: no answer: %s", mdns.TypeToString[qtype], name, server, last)
	return nil
}

func reverse(t *testing.T, ip string) string {
	t.Helper()
	name, err := mdns.ReverseAddr(ip)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// TestDualStackRecords serves a dual-stack cluster's names from the node's
// DNS, at an IPv4 cluster DNS address and at an IPv6 one (a cluster whose
// first service CIDR is IPv6): A and AAAA for a Service with a ClusterIP
// of each family and for a headless Service's endpoints, PTR of both
// families, AAAA for pods.
func TestDualStackRecords(t *testing.T) {
	kubeconfig := fakeAPI(t, dualStackCluster())
	resolvConf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolvConf, []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testcluster.InNewNetns(t, func() {
		testcluster.Loopback(t)
		for _, address := range []string{"10.43.0.10", "fd43::a"} {
			t.Run(address, func(t *testing.T) {
				cfg := Config{
					Address: netip.MustParseAddr(address), Domain: "cluster.local", Kubeconfig: kubeconfig,
					ResolvConf: resolvConf, Corefile: filepath.Join(t.TempDir(), "Corefile"),
				}
				s, err := Start(cfg, fake.NewClientset())
				if err != nil {
					t.Fatal(err)
				}
				defer func() {
					if err := s.Stop(t.Context()); err != nil {
						t.Error(err)
					}
				}()
				for _, tc := range []struct {
					name  string
					qtype uint16
					want  []string
				}{
					{"web.default.svc.cluster.local", mdns.TypeA, []string{"10.43.0.20"}},
					{"web.default.svc.cluster.local", mdns.TypeAAAA, []string{"fd43::20"}},
					{reverse(t, "10.43.0.20"), mdns.TypePTR, []string{"web.default.svc.cluster.local."}},
					{reverse(t, "fd43::20"), mdns.TypePTR, []string{"web.default.svc.cluster.local."}},
					{"db.default.svc.cluster.local", mdns.TypeA, []string{"10.42.0.5", "10.42.1.6"}},
					{"db.default.svc.cluster.local", mdns.TypeAAAA, []string{"fd42:0:0:1::6", "fd42::5"}},
					{"db-1.db.default.svc.cluster.local", mdns.TypeAAAA, []string{"fd42:0:0:1::6"}},
					{reverse(t, "fd42::5"), mdns.TypePTR, []string{"db-0.db.default.svc.cluster.local."}},
					{reverse(t, "10.42.0.5"), mdns.TypePTR, []string{"db-0.db.default.svc.cluster.local."}},
					{"fd42--5.default.pod.cluster.local", mdns.TypeAAAA, []string{"fd42::5"}},
					{"10-42-0-5.default.pod.cluster.local", mdns.TypeA, []string{"10.42.0.5"}},
				} {
					if got := answers(t, cfg.Address, tc.name, tc.qtype); !slices.Equal(got, tc.want) && got != nil {
						t.Errorf("%s %s = %v, want %v", mdns.TypeToString[tc.qtype], tc.name, got, tc.want)
					}
				}
				if got, err := os.ReadFile(cfg.Corefile); err != nil || !strings.Contains(string(got), "bind "+address+"\n") {
					t.Errorf("Corefile %s, %v: want it bound to %s", got, err, address)
				}
			})
		}
	})
}
