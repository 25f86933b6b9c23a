package gateway

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// IngressClassName is the ingressClassName of the Ingresses kelp serves,
// on ports 80 and 443 of every node, beside the Gateways.
const IngressClassName = "kelp"

// Ingress ports.
const (
	ingressHTTPPort  = 80
	ingressHTTPSPort = 443
)

// isKelpIngress says whether kelp serves ing: its class is kelp, by field
// or by the older annotation.
func isKelpIngress(ing *networkingv1.Ingress) bool {
	if ing.Spec.IngressClassName != nil {
		return *ing.Spec.IngressClassName == IngressClassName
	}
	return ing.Annotations["kubernetes.io/ingress.class"] == IngressClassName
}

// ingressListeners turns each Ingress of class kelp into listeners: one
// HTTP listener on port 80 per host of its rules, and one HTTPS listener on
// 443 per host of its tls entries, with the Secret named there.
func (c *compiler) ingressListeners(ings []*networkingv1.Ingress) []*listener {
	ings = slices.Clone(ings)
	slices.SortFunc(ings, olderFirst)
	var out []*listener
	for _, ing := range ings {
		if !isKelpIngress(ing) {
			continue
		}
		// A Gateway of its own for the listeners' bookkeeping: it has no
		// status, its name cannot be a Gateway's, and it is as old as the
		// Ingress, for the hostnames it claims.
		gw := &gatewayv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: ing.Namespace, Name: ingressGatewayPrefix + ing.Name, CreationTimestamp: ing.CreationTimestamp}}
		byHost := map[string][]Route{}
		orders := map[string][]routeOrder{}
		var hosts []string
		add := func(host string, ri, pi int, path PathMatch, backend *networkingv1.IngressBackend) {
			if _, ok := byHost[host]; !ok {
				hosts = append(hosts, host)
			}
			rt := Route{Name: ing.Namespace + "/" + ing.Name, Path: path, Backends: []Backend{c.ingressBackend(ing.Namespace, backend)}}
			byHost[host] = append(byHost[host], rt)
			orders[host] = append(orders[host], routeOrder{exact: path.Type == PathExact, pathLen: len(path.Value), created: ing.CreationTimestamp, key: rt.Name, rule: ri, match: pi})
		}
		for ri, rule := range ing.Spec.Rules {
			if rule.HTTP == nil {
				continue
			}
			for pi, p := range rule.HTTP.Paths {
				path := PathMatch{Type: PathPrefix, Value: cmp.Or(p.Path, "/")}
				if p.PathType != nil && *p.PathType == networkingv1.PathTypeExact {
					path.Type = PathExact
				}
				add(strings.ToLower(rule.Host), ri, pi, path, &p.Backend)
			}
		}
		if ing.Spec.DefaultBackend != nil {
			// After every rule: the longest path wins, and this one is
			// shorter than any, with the last rule index.
			add("", len(ing.Spec.Rules), 0, PathMatch{Type: PathPrefix, Value: ""}, ing.Spec.DefaultBackend)
		}
		// A rule without a host applies to every host.
		for _, h := range hosts {
			if h != "" {
				byHost[h] = append(byHost[h], byHost[""]...)
				orders[h] = append(orders[h], orders[""]...)
			}
		}
		for _, h := range hosts {
			out = append(out, ingressListener(gw, fmt.Sprintf("http-%s", h), ingressHTTPPort, h, nil, byHost[h], orders[h]))
		}
		for _, t := range ing.Spec.TLS {
			tlsHosts := t.Hosts
			if len(tlsHosts) == 0 {
				tlsHosts = []string{""}
			}
			for _, h := range tlsHosts {
				h = strings.ToLower(h)
				from := h
				if _, ok := byHost[h]; !ok {
					from = ""
				}
				l := ingressListener(gw, "https-"+h, ingressHTTPSPort, h, &gatewayv1.ListenerTLSConfig{
					CertificateRefs: []gatewayv1.SecretObjectReference{{Name: gatewayv1.ObjectName(t.SecretName)}},
				}, byHost[from], orders[from])
				c.tls(l)
				out = append(out, l)
			}
		}
	}
	return out
}

func ingressListener(gw *gatewayv1.Gateway, name string, port int32, host string, tls *gatewayv1.ListenerTLSConfig, routes []Route, order []routeOrder) *listener {
	protocol := gatewayv1.HTTPProtocolType
	if tls != nil {
		protocol = gatewayv1.HTTPSProtocolType
	}
	l := &listener{
		gw:       gw,
		spec:     gatewayv1.Listener{Name: gatewayv1.SectionName(name), Port: port, Protocol: protocol, TLS: tls},
		hostname: host,
		accepted: true,
		resolved: true,
		kinds:    []gatewayv1.RouteGroupKind{},
	}
	for _, r := range routes {
		if host != "" {
			r.Hostnames = []string{host}
		}
		l.routes = append(l.routes, r)
	}
	l.order = slices.Clone(order)
	return l
}

// ingressBackend resolves an Ingress backend: a Service of the Ingress's
// namespace, by port number or name.
func (c *compiler) ingressBackend(ns string, b *networkingv1.IngressBackend) Backend {
	out := Backend{Weight: 1, Invalid: true}
	if b.Service == nil {
		return out
	}
	svc := c.services[types.NamespacedName{Namespace: ns, Name: b.Service.Name}]
	if svc == nil {
		return out
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		if b.Service.Port.Name != "" {
			return p.Name == b.Service.Port.Name
		}
		return p.Port == b.Service.Port.Number
	})
	if i < 0 {
		return out
	}
	return Backend{Weight: 1, Namespace: ns, Service: svc.Name, PortName: svc.Spec.Ports[i].Name, Port: svc.Spec.Ports[i].Port}
}
