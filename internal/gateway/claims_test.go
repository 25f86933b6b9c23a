package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func listenerStatus(t *testing.T, st Status, gw types.NamespacedName, name string) gatewayv1.ListenerStatus {
	t.Helper()
	for _, l := range st.Gateways[gw].Listeners {
		if string(l.Name) == name {
			return l
		}
	}
	t.Fatalf("Gateway %s has no status of listener %s", gw, name)
	return gatewayv1.ListenerStatus{}
}

func kelpIngress(ns, name string, age time.Duration, host string, path networkingv1.HTTPIngressPath, tlsSecret string) *networkingv1.Ingress {
	ing := &networkingv1.Ingress{ObjectMeta: meta(ns, name, age), Spec: networkingv1.IngressSpec{
		IngressClassName: ptr(IngressClassName),
		Rules: []networkingv1.IngressRule{{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
			Paths: []networkingv1.HTTPIngressPath{path},
		}}}},
	}}
	if tlsSecret != "" {
		ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{host}, SecretName: tlsSecret}}
	}
	return ing
}

func ingressPath(exactPath, service string) networkingv1.HTTPIngressPath {
	exactType := networkingv1.PathTypeExact
	return networkingv1.HTTPIngressPath{Path: exactPath, PathType: &exactType, Backend: networkingv1.IngressBackend{
		Service: &networkingv1.IngressServiceBackend{Name: service, Port: networkingv1.ServiceBackendPort{Number: 80}},
	}}
}

// routedTo is the namespace/name of the route a request is routed to on
// a port of cfg, or "".
func routedTo(cfg Config, port int32, method, host, path string) string {
	for _, p := range cfg.Ports {
		if p.Port != port || p.Address != "" {
			continue
		}
		h := matchHost(p.Hosts, host)
		if h == nil {
			return ""
		}
		if rt := matchRoute(h.Routes, httptest.NewRequest(method, "http://"+host+path, nil), host, newRegexpCache(cfg)); rt != nil {
			return rt.Name
		}
	}
	return ""
}

// A hostname on a port belongs to the namespace of the oldest Gateway or
// Ingress that listens there: an Ingress of another namespace is not
// merged into a Gateway's listener (nor served under its certificate), a
// Gateway of another namespace is Conflicted, and within one namespace
// listeners still share the hostname.
func TestHostnameOwner(t *testing.T) {
	shopCert, shopKey := tlsPair(t)
	evilCert, evilKey := tlsPair(t)
	shopGW := types.NamespacedName{Namespace: "shop", Name: "gw"}
	otherGW := types.NamespacedName{Namespace: "other", Name: "gw"}
	listener := httpsListener("https", 443, "", "tls")
	listener.Hostname = ptr(gatewayv1.Hostname("shop.example.com"))
	shopRoute := route("shop", "login", time.Hour, parentOf("gw"), rule("", "web"))
	objs := Objects{
		GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()},
		Gateways: []*gatewayv1.Gateway{
			aged(gateway("shop", "gw", listener), time.Hour),
			gateway("other", "gw", listener),
			aged(gateway("late", "gw", httpListener("http", 80, "first.example.com")), time.Minute),
		},
		HTTPRoutes: []*gatewayv1.HTTPRoute{shopRoute},
		Ingresses: []*networkingv1.Ingress{
			kelpIngress("evil", "grab", 0, "shop.example.com", ingressPath("/login", "steal"), "evil-tls"),
			kelpIngress("shop", "extra", 30*time.Minute, "shop.example.com", ingressPath("/extra", "web"), "tls"),
			kelpIngress("first", "app", 2*time.Hour, "first.example.com", ingressPath("/", "app"), ""),
		},
		Services: []*corev1.Service{service("shop", "web"), service("evil", "steal"), service("first", "app")},
		Secrets:  []*corev1.Secret{tlsSecret("shop", "tls", shopCert, shopKey), tlsSecret("evil", "evil-tls", evilCert, evilKey), tlsSecret("other", "tls", evilCert, evilKey)},
		Nodes:    []*corev1.Node{node("n1", "192.0.2.1", "")},
	}
	cfg, st := Compile(objs)

	if got := routedTo(cfg, 443, "POST", "shop.example.com", "/login"); got != "shop/login" {
		t.Errorf("POST https://shop.example.com/login routed to %q, want shop/login", got)
	}
	if got := routedTo(cfg, 443, "GET", "shop.example.com", "/extra"); got != "shop/extra" {
		t.Errorf("https://shop.example.com/extra routed to %q, want shop/extra (an Ingress of the Gateway's namespace)", got)
	}
	for _, p := range cfg.Ports {
		if p.Port != 443 {
			continue
		}
		if h := matchHost(p.Hosts, "shop.example.com"); h == nil || !bytes.Equal(cfg.Certs[h.CertID].Cert, shopCert) {
			t.Errorf("shop.example.com on 443 is not served under shop/tls's certificate: %+v", h)
		}
	}
	checkConditions(t, "listener shop/gw https", listenerStatus(t, st, shopGW, "https").Conditions, 3,
		condition{"Conflicted", false, "NoConflicts"}, condition{"Programmed", true, "Programmed"})
	other := listenerStatus(t, st, otherGW, "https").Conditions
	checkConditions(t, "listener other/gw https", other, 3,
		condition{"Conflicted", true, "HostnameConflict"}, condition{"Programmed", false, "Invalid"})
	if msg := conditionMessage(other, "Conflicted"); !strings.Contains(msg, "namespace shop") || !strings.Contains(msg, "Gateway shop/gw") {
		t.Errorf("Conflicted message %q does not name the owner", msg)
	}
	checkConditions(t, "listener late/gw http", listenerStatus(t, st, types.NamespacedName{Namespace: "late", Name: "gw"}, "http").Conditions, 3,
		condition{"Conflicted", true, "HostnameConflict"})
	if got := routedTo(cfg, 80, "GET", "first.example.com", "/"); got != "first/app" {
		t.Errorf("http://first.example.com/ routed to %q, want first/app (the older Ingress)", got)
	}

	grab := st.Ingresses[types.NamespacedName{Namespace: "evil", Name: "grab"}]
	if len(grab) != 1 || len(grab[0].Ports) != 2 {
		t.Fatalf("status of Ingress evil/grab %+v, want its address with ports 80 and 443 in error", grab)
	}
	for _, p := range grab[0].Ports {
		if p.Error == nil || *p.Error != "gateway.kelp.io/HostnameConflict" {
			t.Errorf("port %d of Ingress evil/grab: error %v, want gateway.kelp.io/HostnameConflict", p.Port, p.Error)
		}
	}
	if extra := st.Ingresses[types.NamespacedName{Namespace: "shop", Name: "extra"}]; len(extra) != 1 || len(extra[0].Ports) != 0 {
		t.Errorf("status of Ingress shop/extra %+v, want its address and no port error", extra)
	}
}

// A node that says a port is in use there takes only itself off the
// listeners of that port: the others serve them, the status names it, and
// it does not hold a Gateway address whose ports it cannot serve. Only
// when every node says so is the listener not accepted.
func TestPortInUseOnOneNode(t *testing.T) {
	gw := types.NamespacedName{Namespace: "infra", Name: "gw"}
	busy := node("n1", "192.0.2.1", "80")
	cfg, st := Compile(Objects{
		GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()},
		Gateways:       []*gatewayv1.Gateway{gateway("infra", "gw", httpListener("http", 80, ""))},
		Nodes:          []*corev1.Node{busy, node("n2", "192.0.2.2", "")},
	})
	conds := listenerStatus(t, st, gw, "http").Conditions
	checkConditions(t, "listener http", conds, 3, condition{"Accepted", true, "Accepted"}, condition{"Programmed", true, "Programmed"})
	if msg := conditionMessage(conds, "Programmed"); !strings.Contains(msg, "n1") {
		t.Errorf("Programmed message %q does not name n1", msg)
	}
	if len(cfg.Ports) != 1 || cfg.Ports[0].Port != 80 {
		t.Errorf("ports %+v, want 80", cfg.Ports)
	}

	// A Gateway address moves off the node that cannot serve its port.
	n1, n2 := readyNode("n1", "10.0.0.1"), readyNode("n2", "10.0.0.2")
	n1.Annotations[UnavailablePortsAnnotation] = "80"
	held := withStatusAddress(gateway("infra", "gw", httpListener("http", 80, "")), "10.0.0.100")
	cfg, st = Compile(Objects{
		GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()},
		Gateways:       []*gatewayv1.Gateway{held},
		Nodes:          []*corev1.Node{n1, n2},
		AddressRanges:  ranges(t, "10.0.0.100-10.0.0.110"),
		Held:           []HeldAddress{{Address: "10.0.0.100", Node: "n1"}},
	})
	if len(cfg.Addresses) != 1 || cfg.Addresses[0].Node != "n2" {
		t.Errorf("held addresses %+v, want 10.0.0.100 on n2", cfg.Addresses)
	}
	checkConditions(t, "listener http", listenerStatus(t, st, gw, "http").Conditions, 3, condition{"Programmed", true, "Programmed"})
}

// bigPair is a certificate whose chain takes about size bytes: the leaf
// and copies of it as intermediates.
func bigPair(t *testing.T, size int) (certPEM, keyPEM []byte) {
	certPEM, keyPEM = tlsPair(t)
	leaf := certPEM
	for len(certPEM) < size {
		certPEM = append(certPEM, leaf...)
	}
	return certPEM, keyPEM
}

// A certificate is published once however many listeners use it; one
// larger than kelp serves is refused on its listener; and listeners that
// would take the published Config over its limit are refused, the newest
// first, while the others are served and every status is computed.
func TestConfigFits(t *testing.T) {
	cert, key := bigPair(t, 40<<10)
	var ls []gatewayv1.Listener
	for i := range 8 {
		l := httpsListener(fmt.Sprintf("h%d", i), 443, "", "big")
		l.Hostname = ptr(gatewayv1.Hostname(fmt.Sprintf("h%d.example.com", i)))
		ls = append(ls, l)
	}
	huge, hugeKey := bigPair(t, maxCertBytes+1)
	ls = append(ls, httpsListener("huge", 8443, "", "huge"))
	cfg, st := Compile(Objects{
		GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()},
		Gateways:       []*gatewayv1.Gateway{gateway("infra", "gw", ls...)},
		Secrets:        []*corev1.Secret{tlsSecret("infra", "big", cert, key), tlsSecret("infra", "huge", huge, hugeKey)},
		Nodes:          []*corev1.Node{node("n1", "192.0.2.1", "")},
	})
	data, _ := json.Marshal(cfg)
	if len(cfg.Certs) != 1 || len(data) > 80<<10 {
		t.Errorf("%d certificates in %d KiB of Config, want one in less than 80 KiB", len(cfg.Certs), len(data)>>10)
	}
	gw := types.NamespacedName{Namespace: "infra", Name: "gw"}
	checkConditions(t, "listener huge", listenerStatus(t, st, gw, "huge").Conditions, 3, condition{"ResolvedRefs", false, "InvalidCertificateRef"})
	checkConditions(t, "listener h7", listenerStatus(t, st, gw, "h7").Conditions, 3, condition{"Programmed", true, "Programmed"})

	// Twenty Gateways of twenty tenants with a certificate of 60 KiB each.
	cert, key = bigPair(t, 60<<10)
	objs := Objects{GatewayClasses: []*gatewayv1.GatewayClass{kelpClass()}, Nodes: []*corev1.Node{node("n1", "192.0.2.1", "")}}
	for i := range 20 {
		ns := fmt.Sprintf("tenant%02d", i)
		l := httpsListener("https", 443, "", "tls")
		l.Hostname = ptr(gatewayv1.Hostname(ns + ".example.com"))
		objs.Gateways = append(objs.Gateways, aged(gateway(ns, "gw", l), time.Duration(20-i)*time.Minute))
		objs.Secrets = append(objs.Secrets, tlsSecret(ns, "tls", append(slices.Clone(cert), fmt.Sprintf("# %s\n", ns)...), key))
	}
	cfg, st = Compile(objs)
	if data, _ := json.Marshal(cfg); len(data) > 1<<20 || len(cfg.Certs) < 5 {
		t.Errorf("Config of %d KiB with %d certificates, want under 1 MiB with the oldest tenants' certificates", len(data)>>10, len(cfg.Certs))
	}
	oldest := listenerStatus(t, st, types.NamespacedName{Namespace: "tenant00", Name: "gw"}, "https").Conditions
	checkConditions(t, "tenant00", oldest, 3, condition{"Programmed", true, "Programmed"})
	newest := listenerStatus(t, st, types.NamespacedName{Namespace: "tenant19", Name: "gw"}, "https").Conditions
	checkConditions(t, "tenant19", newest, 3, condition{"Programmed", false, "Invalid"})
	if msg := conditionMessage(newest, "Programmed"); !strings.Contains(msg, "full") {
		t.Errorf("tenant19's Programmed message %q does not say the configuration is full", msg)
	}
}
