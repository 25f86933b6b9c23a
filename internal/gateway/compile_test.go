package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	"sigs.k8s.io/gateway-api/pkg/features"
)

func meta(ns, name string, age time.Duration) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 3, CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(-age))}
}

func kelpClass() *gatewayv1.GatewayClass {
	return &gatewayv1.GatewayClass{ObjectMeta: meta("", ClassName, 0), Spec: gatewayv1.GatewayClassSpec{ControllerName: ControllerName}}
}

func node(name, ip string, unavailable string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	if unavailable != "" {
		n.Annotations = map[string]string{UnavailablePortsAnnotation: unavailable}
	}
	return n
}

func gateway(ns, name string, ls ...gatewayv1.Listener) *gatewayv1.Gateway {
	return &gatewayv1.Gateway{ObjectMeta: meta(ns, name, 0), Spec: gatewayv1.GatewaySpec{GatewayClassName: ClassName, Listeners: ls}}
}

func httpListener(name string, port int32, hostname string) gatewayv1.Listener {
	l := gatewayv1.Listener{Name: gatewayv1.SectionName(name), Port: port, Protocol: gatewayv1.HTTPProtocolType}
	if hostname != "" {
		l.Hostname = ptr(gatewayv1.Hostname(hostname))
	}
	return l
}

func httpsListener(name string, port int32, secretNS, secret string) gatewayv1.Listener {
	ref := gatewayv1.SecretObjectReference{Name: gatewayv1.ObjectName(secret)}
	if secretNS != "" {
		ref.Namespace = ptr(gatewayv1.Namespace(secretNS))
	}
	return gatewayv1.Listener{Name: gatewayv1.SectionName(name), Port: port, Protocol: gatewayv1.HTTPSProtocolType, TLS: &gatewayv1.ListenerTLSConfig{CertificateRefs: []gatewayv1.SecretObjectReference{ref}}}
}

func service(ns, name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: meta(ns, name, 0), Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "web", Port: 80}}}}
}

type routeOpt func(*gatewayv1.HTTPRoute)

func route(ns, name string, age time.Duration, opts ...routeOpt) *gatewayv1.HTTPRoute {
	r := &gatewayv1.HTTPRoute{ObjectMeta: meta(ns, name, age)}
	r.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "gw", Namespace: ptr(gatewayv1.Namespace("infra"))}}
	for _, o := range opts {
		o(r)
	}
	return r
}

func hostnames(h ...string) routeOpt {
	return func(r *gatewayv1.HTTPRoute) {
		for _, x := range h {
			r.Spec.Hostnames = append(r.Spec.Hostnames, gatewayv1.Hostname(x))
		}
	}
}

func rule(backendNS, backend string, matches ...gatewayv1.HTTPRouteMatch) routeOpt {
	return func(r *gatewayv1.HTTPRoute) {
		ref := gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{Name: gatewayv1.ObjectName(backend), Port: ptr(gatewayv1.PortNumber(80))}}}
		if backendNS != "" {
			ref.Namespace = ptr(gatewayv1.Namespace(backendNS))
		}
		r.Spec.Rules = append(r.Spec.Rules, gatewayv1.HTTPRouteRule{Matches: matches, BackendRefs: []gatewayv1.HTTPBackendRef{ref}})
	}
}

func parent(section string) routeOpt {
	return func(r *gatewayv1.HTTPRoute) { r.Spec.ParentRefs[0].SectionName = ptr(gatewayv1.SectionName(section)) }
}

func prefix(p string) gatewayv1.HTTPRouteMatch {
	return gatewayv1.HTTPRouteMatch{Path: &gatewayv1.HTTPPathMatch{Type: ptr(gatewayv1.PathMatchPathPrefix), Value: ptr(p)}}
}

func exact(p string) gatewayv1.HTTPRouteMatch {
	return gatewayv1.HTTPRouteMatch{Path: &gatewayv1.HTTPPathMatch{Type: ptr(gatewayv1.PathMatchExact), Value: ptr(p)}}
}

func allNamespaces(l gatewayv1.Listener) gatewayv1.Listener {
	l.AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr(gatewayv1.NamespacesFromAll)}}
	return l
}

func tlsPair(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "x"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

func tlsSecret(ns, name string, cert, key []byte) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: meta(ns, name, 0), Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key}}
}

func grant(ns, fromKind, fromNS, toKind string) *gatewayv1beta1.ReferenceGrant {
	return &gatewayv1beta1.ReferenceGrant{ObjectMeta: meta(ns, "grant", 0), Spec: gatewayv1beta1.ReferenceGrantSpec{
		From: []gatewayv1beta1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: gatewayv1.Kind(fromKind), Namespace: gatewayv1.Namespace(fromNS)}},
		To:   []gatewayv1beta1.ReferenceGrantTo{{Group: "", Kind: gatewayv1.Kind(toKind)}},
	}}
}

// condition is one expected condition: its type, status and reason.
type condition struct {
	typ    string
	status bool
	reason string
}

func checkConditions(t *testing.T, what string, got []metav1.Condition, gen int64, want ...condition) {
	t.Helper()
	for _, w := range want {
		c := apimeta.FindStatusCondition(got, w.typ)
		switch {
		case c == nil:
			t.Errorf("%s: no condition %s", what, w.typ)
		case (c.Status == metav1.ConditionTrue) != w.status || c.Reason != w.reason:
			t.Errorf("%s: %s = %s %s (%s), want %v %s", what, w.typ, c.Status, c.Reason, c.Message, w.status, w.reason)
		case c.ObservedGeneration != gen:
			t.Errorf("%s: %s observedGeneration %d, want %d", what, w.typ, c.ObservedGeneration, gen)
		}
	}
}

func TestCompileStatus(t *testing.T) {
	cert, key := tlsPair(t)
	infra := types.NamespacedName{Namespace: "infra", Name: "gw"}
	tests := []struct {
		name     string
		objs     Objects
		gateway  []condition
		listener map[string][]condition
		attached map[string]int32
		route    map[string][]condition // by route name, its one parent
	}{
		{
			name: "accepted and programmed",
			objs: Objects{
				Gateways: []*gatewayv1.Gateway{gateway("infra", "gw", allNamespaces(httpListener("http", 80, "")))},
				HTTPRoutes: []*gatewayv1.HTTPRoute{
					route("app", "r", 0, rule("", "svc")),
				},
				Services: []*corev1.Service{service("app", "svc")},
			},
			gateway:  []condition{{"Accepted", true, "Accepted"}, {"Programmed", true, "Programmed"}},
			listener: map[string][]condition{"http": {{"Accepted", true, "Accepted"}, {"ResolvedRefs", true, "ResolvedRefs"}, {"Conflicted", false, "NoConflicts"}, {"Programmed", true, "Programmed"}}},
			attached: map[string]int32{"http": 1},
			route:    map[string][]condition{"r": {{"Accepted", true, "Accepted"}, {"ResolvedRefs", true, "ResolvedRefs"}}},
		},
		{
			name: "missing Service, wrong kind, other namespace without grant",
			objs: Objects{
				Gateways: []*gatewayv1.Gateway{gateway("infra", "gw", allNamespaces(httpListener("http", 80, "")))},
				HTTPRoutes: []*gatewayv1.HTTPRoute{
					route("app", "missing", 0, rule("", "nothing")),
					route("app", "kind", 0, func(r *gatewayv1.HTTPRoute) {
						rule("", "svc")(r)
						r.Spec.Rules[0].BackendRefs[0].Kind = ptr(gatewayv1.Kind("Pod"))
					}),
					route("app", "cross", 0, rule("other", "svc")),
					route("app", "granted", 0, rule("granted", "svc")),
				},
				Services:        []*corev1.Service{service("app", "svc"), service("other", "svc"), service("granted", "svc")},
				ReferenceGrants: []*gatewayv1beta1.ReferenceGrant{grant("granted", "HTTPRoute", "app", "Service")},
			},
			gateway: []condition{{"Accepted", true, "Accepted"}},
			route: map[string][]condition{
				"missing": {{"Accepted", true, "Accepted"}, {"ResolvedRefs", false, "BackendNotFound"}},
				"kind":    {{"Accepted", true, "Accepted"}, {"ResolvedRefs", false, "InvalidKind"}},
				"cross":   {{"Accepted", true, "Accepted"}, {"ResolvedRefs", false, "RefNotPermitted"}},
				"granted": {{"Accepted", true, "Accepted"}, {"ResolvedRefs", true, "ResolvedRefs"}},
			},
		},
		{
			name: "listeners that do not admit the route",
			objs: Objects{
				Gateways: []*gatewayv1.Gateway{gateway("infra", "gw", httpListener("same", 80, ""), allNamespaces(httpListener("host", 8080, "a.example.com")))},
				HTTPRoutes: []*gatewayv1.HTTPRoute{
					route("app", "ns", 0, parent("same"), rule("", "svc")),
					route("app", "host", 0, parent("host"), hostnames("b.example.com"), rule("", "svc")),
					route("app", "section", 0, parent("nope"), rule("", "svc")),
					route("app", "wildcard", 0, parent("host"), hostnames("*.example.com"), rule("", "svc")),
				},
				Services: []*corev1.Service{service("app", "svc")},
			},
			attached: map[string]int32{"same": 0, "host": 1},
			route: map[string][]condition{
				"ns":       {{"Accepted", false, "NotAllowedByListeners"}},
				"host":     {{"Accepted", false, "NoMatchingListenerHostname"}},
				"section":  {{"Accepted", false, "NoMatchingParent"}},
				"wildcard": {{"Accepted", true, "Accepted"}},
			},
		},
		{
			name: "certificates: bad, missing, other namespace with and without a grant",
			objs: Objects{
				Gateways: []*gatewayv1.Gateway{gateway("infra", "gw",
					httpsListener("good", 443, "", "good"),
					httpsListener("bad", 8443, "", "bad"),
					httpsListener("missing", 9443, "", "nope"),
					httpsListener("cross", 10443, "certs", "good"),
					httpsListener("granted", 11443, "granted", "good"),
				)},
				Secrets: []*corev1.Secret{
					tlsSecret("infra", "good", cert, key),
					tlsSecret("infra", "bad", []byte("-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n"), key),
					tlsSecret("certs", "good", cert, key),
					tlsSecret("granted", "good", cert, key),
				},
				ReferenceGrants: []*gatewayv1beta1.ReferenceGrant{grant("granted", "Gateway", "infra", "Secret")},
			},
			gateway: []condition{{"Accepted", true, "ListenersNotValid"}, {"Programmed", true, "Programmed"}},
			listener: map[string][]condition{
				"good":    {{"ResolvedRefs", true, "ResolvedRefs"}, {"Programmed", true, "Programmed"}},
				"bad":     {{"ResolvedRefs", false, "InvalidCertificateRef"}, {"Programmed", false, "Invalid"}},
				"missing": {{"ResolvedRefs", false, "InvalidCertificateRef"}},
				"cross":   {{"ResolvedRefs", false, "RefNotPermitted"}},
				"granted": {{"ResolvedRefs", true, "ResolvedRefs"}},
			},
		},
		{
			name: "unsupported protocol, conflicts, a port in use on a node",
			objs: Objects{
				Gateways: []*gatewayv1.Gateway{gateway("infra", "gw",
					gatewayv1.Listener{Name: "udp", Port: 53, Protocol: gatewayv1.UDPProtocolType},
					httpListener("a", 80, "x.example.com"),
					httpListener("b", 80, "x.example.com"),
					httpListener("c", 81, ""),
					httpsListener("d", 81, "", "none"),
					httpListener("busy", 82, ""),
				)},
				Nodes: []*corev1.Node{node("n1", "192.0.2.1", "82"), node("n2", "192.0.2.2", "82")},
			},
			gateway: []condition{{"Accepted", true, "ListenersNotValid"}},
			listener: map[string][]condition{
				"udp":  {{"Accepted", false, "UnsupportedProtocol"}},
				"a":    {{"Conflicted", true, "HostnameConflict"}, {"Programmed", false, "Invalid"}},
				"b":    {{"Conflicted", true, "HostnameConflict"}},
				"c":    {{"Conflicted", false, "NoConflicts"}, {"Programmed", true, "Programmed"}},
				"d":    {{"Conflicted", true, "ProtocolConflict"}},
				"busy": {{"Accepted", false, "PortUnavailable"}, {"Programmed", false, "Invalid"}},
			},
		},
		{
			name: "no listener valid",
			objs: Objects{
				Gateways: []*gatewayv1.Gateway{gateway("infra", "gw", gatewayv1.Listener{Name: "tcp", Port: 53, Protocol: gatewayv1.TCPProtocolType})},
			},
			gateway:  []condition{{"Accepted", false, "ListenersNotValid"}, {"Programmed", false, "Invalid"}},
			listener: map[string][]condition{"tcp": {{"Accepted", false, "UnsupportedProtocol"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := tt.objs
			objs.GatewayClasses = []*gatewayv1.GatewayClass{kelpClass(), {ObjectMeta: meta("", "other", 0), Spec: gatewayv1.GatewayClassSpec{ControllerName: "example.com/other"}}}
			if objs.Nodes == nil {
				objs.Nodes = []*corev1.Node{node("n1", "192.0.2.1", "")}
			}
			_, st := Compile(objs)
			checkConditions(t, "GatewayClass kelp", st.GatewayClasses[ClassName].Conditions, 3, condition{"Accepted", true, "Accepted"})
			if _, ok := st.GatewayClasses["other"]; ok {
				t.Error("status for another controller's GatewayClass")
			}
			gs, ok := st.Gateways[infra]
			if !ok {
				t.Fatal("no status for the Gateway")
			}
			checkConditions(t, "Gateway", gs.Conditions, 3, tt.gateway...)
			for _, l := range gs.Listeners {
				checkConditions(t, "listener "+string(l.Name), l.Conditions, 3, tt.listener[string(l.Name)]...)
				if want, ok := tt.attached[string(l.Name)]; ok && l.AttachedRoutes != want {
					t.Errorf("listener %s: attachedRoutes %d, want %d", l.Name, l.AttachedRoutes, want)
				}
			}
			for name, want := range tt.route {
				ps := st.HTTPRoutes[types.NamespacedName{Namespace: "app", Name: name}]
				if len(ps) != 1 {
					t.Errorf("route %s: %d parents, want 1", name, len(ps))
					continue
				}
				if ps[0].ControllerName != ControllerName {
					t.Errorf("route %s: controllerName %s", name, ps[0].ControllerName)
				}
				checkConditions(t, "route "+name, ps[0].Conditions, 3, want...)
			}
		})
	}
}

func TestCompileAddresses(t *testing.T) {
	ext := node("n2", "10.0.0.2", "")
	ext.Status.Addresses = append(ext.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.2"})
	_, st := Compile(Objects{
		GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()},
		Gateways:       []*gatewayv1.Gateway{gateway("infra", "gw", httpListener("http", 80, ""))},
		Nodes:          []*corev1.Node{ext, node("n1", "10.0.0.1", "")},
	})
	got := st.Gateways[types.NamespacedName{Namespace: "infra", Name: "gw"}].Addresses
	if len(got) != 2 || got[0].Value != "10.0.0.1" || got[1].Value != "203.0.113.2" {
		t.Errorf("addresses %+v, want 10.0.0.1 and 203.0.113.2 (n2's external IP)", got)
	}
}

// In a dual-stack cluster a Gateway is reached at each node's address of
// each family, the node's external IP of a family standing for its
// internal one; Ingresses of the class kelp too.
func TestCompileAddressesDualStack(t *testing.T) {
	addrs := func(name string, as ...corev1.NodeAddress) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: as}}
	}
	internal := func(ip string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
	}
	external := func(ip string) corev1.NodeAddress {
		return corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip}
	}
	nodes := []*corev1.Node{
		addrs("n1", internal("10.0.0.1"), internal("fd00::1"), corev1.NodeAddress{Type: corev1.NodeHostName, Address: "n1"}),
		// IPv6 first, an external IPv6 address, a second internal IPv4 one.
		addrs("n2", internal("fd00::2"), internal("10.0.0.2"), internal("10.0.0.22"), external("2001:db8::2")),
		addrs("n3", internal("fd00:0:0::3")), // IPv6 only, not canonical
		addrs("n4", internal("10.0.0.4"), external("203.0.113.4"), internal("fd00::4")),
	}
	ing := &networkingv1.Ingress{ObjectMeta: meta("app", "web", 0), Spec: networkingv1.IngressSpec{
		IngressClassName: ptr(IngressClassName),
		DefaultBackend:   &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Number: 80}}},
	}}
	_, st := Compile(Objects{
		GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()},
		Gateways:       []*gatewayv1.Gateway{gateway("infra", "gw", httpListener("http", 8080, ""))},
		Ingresses:      []*networkingv1.Ingress{ing},
		Services:       []*corev1.Service{service("app", "web")},
		Nodes:          nodes,
	})
	want := []string{"10.0.0.1", "fd00::1", "2001:db8::2", "10.0.0.2", "fd00::3", "203.0.113.4", "fd00::4"}
	var got []string
	for _, a := range st.Gateways[types.NamespacedName{Namespace: "infra", Name: "gw"}].Addresses {
		if a.Type == nil || *a.Type != gatewayv1.IPAddressType {
			t.Errorf("address %+v is not of type IPAddress", a)
		}
		got = append(got, a.Value)
	}
	if !slices.Equal(got, want) {
		t.Errorf("Gateway addresses %v, want %v", got, want)
	}
	got = nil
	for _, a := range st.Ingresses[types.NamespacedName{Namespace: "app", Name: "web"}] {
		got = append(got, a.IP)
	}
	if !slices.Equal(got, want) {
		t.Errorf("Ingress addresses %v, want %v", got, want)
	}

	// A Gateway's status holds 16 addresses at most: the first nodes'.
	var many []*corev1.Node
	for i := range 10 {
		many = append(many, addrs(fmt.Sprintf("n%02d", i), internal(fmt.Sprintf("10.0.0.%d", i)), internal(fmt.Sprintf("fd00::%d", i))))
	}
	_, st = Compile(Objects{
		GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()},
		Gateways:       []*gatewayv1.Gateway{gateway("infra", "gw", httpListener("http", 80, ""))},
		Nodes:          many,
	})
	gw := st.Gateways[types.NamespacedName{Namespace: "infra", Name: "gw"}]
	if n := len(gw.Addresses); n != 16 || gw.Addresses[15].Value != "fd00::7" {
		t.Errorf("%d addresses %+v, want the 16 of n00 to n07", n, gw.Addresses)
	}
	if !apimeta.IsStatusConditionTrue(gw.Conditions, string(gatewayv1.GatewayConditionProgrammed)) {
		t.Errorf("conditions %+v: want Programmed", gw.Conditions)
	}
}

// TestCompileRouting compiles routes and sends requests through the
// result: matching on hostname, path, method, headers and query, the
// spec's precedence between routes, and invalid backends.
func TestCompileRouting(t *testing.T) {
	header := func(m gatewayv1.HTTPRouteMatch, name, value string) gatewayv1.HTTPRouteMatch {
		m.Headers = append(m.Headers, gatewayv1.HTTPHeaderMatch{Name: gatewayv1.HTTPHeaderName(name), Value: value})
		return m
	}
	query := func(m gatewayv1.HTTPRouteMatch, name, value string) gatewayv1.HTTPRouteMatch {
		m.QueryParams = append(m.QueryParams, gatewayv1.HTTPQueryParamMatch{Name: gatewayv1.HTTPHeaderName(name), Value: value})
		return m
	}
	method := func(m gatewayv1.HTTPRouteMatch, v string) gatewayv1.HTTPRouteMatch {
		m.Method = ptr(gatewayv1.HTTPMethod(v))
		return m
	}
	var svcs []*corev1.Service
	for _, s := range []string{"root", "foo", "foo-exact", "foo-post", "foo-header", "foo-two-headers", "foo-query", "older", "newer", "wild", "exact-host", "a-ns", "b-ns"} {
		svcs = append(svcs, service("app", s), service("b", s))
	}
	objs := Objects{
		GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()},
		Gateways: []*gatewayv1.Gateway{gateway("infra", "gw",
			allNamespaces(httpListener("any", 80, "")),
			allNamespaces(httpListener("specific", 80, "only.example.com")),
		)},
		Services: svcs,
		Nodes:    []*corev1.Node{node("n1", "192.0.2.1", "")},
		HTTPRoutes: []*gatewayv1.HTTPRoute{
			route("app", "main", 0, hostnames("example.com"),
				rule("", "root", prefix("/")),
				rule("", "foo", prefix("/foo/")),
				rule("", "foo-exact", exact("/foo")),
				rule("", "foo-post", method(prefix("/foo"), "POST")),
				rule("", "foo-header", header(prefix("/foo"), "X-A", "1")),
				rule("", "foo-two-headers", header(header(prefix("/foo"), "X-A", "1"), "X-B", "2")),
				rule("", "foo-query", query(prefix("/foo"), "q", "yes")),
				rule("", "missing", prefix("/missing")),
			),
			// Same host and path: the older route wins, then namespace/name.
			route("app", "newer", time.Minute, hostnames("example.com"), rule("", "newer", prefix("/tie"))),
			route("app", "older", time.Hour, hostnames("example.com"), rule("", "older", prefix("/tie"))),
			route("b", "same-age", 2*time.Hour, hostnames("example.com"), rule("", "b-ns", prefix("/same-age"))),
			route("a", "same-age", 2*time.Hour, hostnames("example.com"), rule("b", "a-ns", prefix("/same-age"))),
			// Hostnames: an exact name beats a wildcard.
			route("app", "wild", 0, hostnames("*.example.com"), rule("", "wild")),
			route("app", "exact-host", 0, hostnames("www.example.com"), rule("", "exact-host")),
			// Only the listener only.example.com serves its host.
			route("app", "specific", 0, parent("specific"), rule("", "foo")),
		},
		ReferenceGrants: []*gatewayv1beta1.ReferenceGrant{grant("b", "HTTPRoute", "a", "Service")},
	}
	cfg, _ := Compile(objs)
	if len(cfg.Ports) != 1 || cfg.Ports[0].Port != 80 {
		t.Fatalf("ports %+v, want 80 alone", cfg.Ports)
	}
	p := cfg.Ports[0]
	regexps := newRegexpCache(cfg)
	for _, tt := range []struct {
		method, host, target string
		headers              map[string]string
		want                 string // the Service; "" no route; "!" an invalid backend
	}{
		{"GET", "example.com", "/", nil, "root"},
		{"GET", "example.com:80", "/bar", nil, "root"},
		{"GET", "example.com", "/foo", nil, "foo-exact"},
		{"GET", "example.com", "/foo/x", nil, "foo"},
		{"GET", "example.com", "/foobar", nil, "root"},
		{"POST", "example.com", "/foo/x", nil, "foo"},
		{"POST", "example.com", "/fo", nil, "root"},
		{"POST", "example.com", "/foox", nil, "root"},
		{"GET", "example.com", "/foo/x", map[string]string{"X-A": "1"}, "foo"},
		{"GET", "example.com", "/fooy", map[string]string{"X-A": "1"}, "root"},
		{"PUT", "example.com", "/foo-z", nil, "root"},
		{"GET", "example.com", "/tie", nil, "older"},
		{"GET", "example.com", "/same-age", nil, "a-ns"},
		{"GET", "example.com", "/missing/x", nil, "!"},
		{"GET", "www.example.com", "/", nil, "exact-host"},
		{"GET", "api.example.com", "/", nil, "wild"},
		{"GET", "only.example.com", "/", nil, "foo"},
		{"GET", "other.org", "/", nil, ""},
	} {
		r := httptest.NewRequest(tt.method, "http://"+tt.host+tt.target, nil)
		for k, v := range tt.headers {
			r.Header.Set(k, v)
		}
		host := stripPort(tt.host)
		got := ""
		if h := matchHost(p.Hosts, host); h != nil {
			if rt := matchRoute(h.Routes, r, host, regexps); rt != nil {
				got = rt.Backends[0].Service
				if rt.Backends[0].Invalid {
					got = "!"
				}
			}
		}
		if got != tt.want {
			t.Errorf("%s %s%s %v: routed to %q, want %q", tt.method, tt.host, tt.target, tt.headers, got, tt.want)
		}
	}
}

// TestPrecedenceWithinPath checks the tie-breaks after the path: method,
// then the number of headers, then of query parameters.
func TestPrecedenceWithinPath(t *testing.T) {
	m := func(path string, method string, headers, query int) gatewayv1.HTTPRouteMatch {
		x := prefix(path)
		if method != "" {
			x.Method = ptr(gatewayv1.HTTPMethod(method))
		}
		for i := range headers {
			x.Headers = append(x.Headers, gatewayv1.HTTPHeaderMatch{Name: gatewayv1.HTTPHeaderName("X-H" + string(rune('a'+i))), Value: "1"})
		}
		for i := range query {
			x.QueryParams = append(x.QueryParams, gatewayv1.HTTPQueryParamMatch{Name: gatewayv1.HTTPHeaderName("q" + string(rune('a'+i))), Value: "1"})
		}
		return x
	}
	var svcs []*corev1.Service
	for _, s := range []string{"plain", "method", "one-header", "two-headers", "query"} {
		svcs = append(svcs, service("app", s))
	}
	cfg, _ := Compile(Objects{
		GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()},
		Gateways:       []*gatewayv1.Gateway{gateway("infra", "gw", allNamespaces(httpListener("any", 80, "")))},
		Services:       svcs,
		Nodes:          []*corev1.Node{node("n1", "192.0.2.1", "")},
		HTTPRoutes: []*gatewayv1.HTTPRoute{route("app", "r", 0,
			rule("", "plain", m("/p", "", 0, 0)),
			rule("", "query", m("/p", "", 0, 1)),
			rule("", "one-header", m("/p", "", 1, 0)),
			rule("", "two-headers", m("/p", "", 2, 0)),
			rule("", "method", m("/p", "GET", 0, 0)),
		)},
	})
	var order []string
	for _, rt := range cfg.Ports[0].Hosts[0].Routes {
		order = append(order, rt.Backends[0].Service)
	}
	want := []string{"method", "two-headers", "one-header", "query", "plain"}
	if len(order) != len(want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order %v, want %v", order, want)
		}
	}
}

func stripPort(host string) string {
	for i := len(host) - 1; i >= 0; i-- {
		if host[i] == ':' {
			return host[:i]
		}
	}
	return host
}

func TestReplacePrefix(t *testing.T) {
	for _, tt := range []struct{ path, prefix, repl, want string }{
		{"/foo/bar", "/foo", "/x", "/x/bar"},
		{"/foo/bar", "/foo/", "/x/", "/x/bar"},
		{"/foo/bar", "/foo", "/", "/bar"},
		{"/foo", "/foo", "/x", "/x"},
		{"/foo/", "/foo", "/x", "/x/"},
		{"/foo", "/foo", "/", "/"},
		{"/", "/", "/x", "/x"},
	} {
		if got := replacePrefix(tt.path, tt.prefix, tt.repl); got != tt.want {
			t.Errorf("replacePrefix(%q, %q, %q) = %q, want %q", tt.path, tt.prefix, tt.repl, got, tt.want)
		}
	}
}

func TestIntersect(t *testing.T) {
	for _, tt := range []struct {
		listener string
		route    []gatewayv1.Hostname
		want     []string
		ok       bool
	}{
		{"", nil, nil, true},
		{"a.example.com", nil, []string{"a.example.com"}, true},
		{"", []gatewayv1.Hostname{"a.example.com"}, []string{"a.example.com"}, true},
		{"*.example.com", []gatewayv1.Hostname{"a.example.com", "example.com", "a.b.example.com"}, []string{"a.b.example.com", "a.example.com"}, true},
		{"a.example.com", []gatewayv1.Hostname{"*.example.com"}, []string{"a.example.com"}, true},
		{"a.example.com", []gatewayv1.Hostname{"b.example.com"}, nil, false},
		{"*.example.com", []gatewayv1.Hostname{"*.a.example.com"}, []string{"*.a.example.com"}, true},
	} {
		got, ok := intersect(tt.listener, tt.route)
		if ok != tt.ok || len(got) != len(tt.want) || (len(got) > 0 && got[0] != tt.want[0]) {
			t.Errorf("intersect(%q, %v) = %v %v, want %v %v", tt.listener, tt.route, got, ok, tt.want, tt.ok)
		}
	}
}

// The GatewayClass lists features by names the conformance suite knows.
func TestSupportedFeatures(t *testing.T) {
	known := features.SetsToNamesSet(features.AllFeatures)
	for _, f := range supportedFeatures(true) {
		if !known.Has(features.FeatureName(f.Name)) {
			t.Errorf("feature %s is not one of the conformance suite's", f.Name)
		}
	}
}

// An Ingress of the class kelp is served on 80 and, for its tls hosts,
// 443; one of another class is not.
func TestCompileIngress(t *testing.T) {
	cert, key := tlsPair(t)
	prefixType, exactType := networkingv1.PathTypePrefix, networkingv1.PathTypeExact
	backend := func(name string, port int32) networkingv1.IngressBackend {
		return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: name, Port: networkingv1.ServiceBackendPort{Number: port}}}
	}
	ing := &networkingv1.Ingress{ObjectMeta: meta("app", "web", 0), Spec: networkingv1.IngressSpec{
		IngressClassName: ptr(IngressClassName),
		DefaultBackend:   ptr(backend("root", 80)),
		TLS:              []networkingv1.IngressTLS{{Hosts: []string{"a.example.com"}, SecretName: "a-tls"}},
		Rules: []networkingv1.IngressRule{{Host: "a.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{
			{Path: "/api", PathType: &prefixType, Backend: backend("api", 80)},
			{Path: "/exact", PathType: &exactType, Backend: backend("missing", 80)},
		}}}}},
	}}
	other := &networkingv1.Ingress{ObjectMeta: meta("app", "other", 0), Spec: networkingv1.IngressSpec{IngressClassName: ptr("nginx"), DefaultBackend: ptr(backend("api", 80))}}
	cfg, st := Compile(Objects{
		Ingresses: []*networkingv1.Ingress{ing, other},
		Services:  []*corev1.Service{service("app", "root"), service("app", "api")},
		Secrets:   []*corev1.Secret{tlsSecret("app", "a-tls", cert, key)},
		Nodes:     []*corev1.Node{node("n1", "192.0.2.1", "")},
	})
	if got := st.Ingresses[types.NamespacedName{Namespace: "app", Name: "web"}]; len(got) != 1 || got[0].IP != "192.0.2.1" {
		t.Errorf("Ingress addresses %+v, want the node's", got)
	}
	if _, ok := st.Ingresses[types.NamespacedName{Namespace: "app", Name: "other"}]; ok {
		t.Error("status for an Ingress of another class")
	}
	if len(cfg.Ports) != 2 || cfg.Ports[0].Port != 80 || cfg.Ports[1].Port != 443 || cfg.Ports[1].Protocol != "HTTPS" {
		t.Fatalf("ports %+v, want 80 HTTP and 443 HTTPS", cfg.Ports)
	}
	regexps := newRegexpCache(cfg)
	for _, tt := range []struct {
		port       int
		host, path string
		want       string
	}{
		{0, "a.example.com", "/api/x", "api"},
		{0, "a.example.com", "/exact", "!"},
		{0, "a.example.com", "/other", "root"},
		{0, "b.example.com", "/api", "root"},
		{1, "a.example.com", "/api", "api"},
	} {
		p := cfg.Ports[tt.port]
		got := ""
		if h := matchHost(p.Hosts, tt.host); h != nil {
			if rt := matchRoute(h.Routes, httptest.NewRequest("GET", "http://"+tt.host+tt.path, nil), tt.host, regexps); rt != nil {
				got = rt.Backends[0].Service
				if rt.Backends[0].Invalid {
					got = "!"
				}
			}
		}
		if got != tt.want {
			t.Errorf("port %d %s%s: routed to %q, want %q", p.Port, tt.host, tt.path, got, tt.want)
		}
	}
	if h := matchHost(cfg.Ports[1].Hosts, "a.example.com"); h == nil || cfg.Certs[h.CertID].Cert == nil {
		t.Error("no certificate for a.example.com on 443")
	}
}
