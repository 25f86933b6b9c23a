package gateway

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// refs is what resolving an HTTPRoute's backendRefs found: the first
// failure's reason and message, or none.
type refs struct {
	reason, msg string
}

// route attaches r to the listeners of kelp's Gateways its parentRefs
// name and returns kelp's entries of its status.parents.
func (c *compiler) route(r *gatewayv1.HTTPRoute, byGateway map[types.NamespacedName][]*listener) []gatewayv1.RouteParentStatus {
	gen := r.Generation
	var bad refs
	rules := make([][]Backend, len(r.Spec.Rules))
	for i, rule := range r.Spec.Rules {
		rules[i] = c.backends(r, rule, &bad)
	}
	unsupported := unsupportedFilter(r)
	var out []gatewayv1.RouteParentStatus
	for _, ref := range r.Spec.ParentRefs {
		if (ref.Group != nil && *ref.Group != gatewayv1.GroupName) || (ref.Kind != nil && *ref.Kind != kindGateway) {
			continue
		}
		ns := r.Namespace
		if ref.Namespace != nil {
			ns = string(*ref.Namespace)
		}
		ls, ok := byGateway[types.NamespacedName{Namespace: ns, Name: string(ref.Name)}]
		if !ok {
			continue
		}
		ps := gatewayv1.RouteParentStatus{ParentRef: ref, ControllerName: ControllerName}
		reason, msg := string(gatewayv1.RouteReasonAccepted), "the route is attached"
		attached := false
		if unsupported != "" {
			reason, msg = string(gatewayv1.RouteReasonUnsupportedValue), unsupported
		} else {
			attached, reason, msg = c.attach(r, ref, ls, rules)
		}
		ps.Conditions = append(ps.Conditions, cond(gatewayv1.RouteConditionAccepted, attached, reason, msg, gen))
		if bad.reason != "" {
			ps.Conditions = append(ps.Conditions, cond(gatewayv1.RouteConditionResolvedRefs, false, bad.reason, bad.msg, gen))
		} else {
			ps.Conditions = append(ps.Conditions, cond(gatewayv1.RouteConditionResolvedRefs, true, string(gatewayv1.RouteReasonResolvedRefs), "every backend is resolved", gen))
		}
		out = append(out, ps)
	}
	return out
}

// unsupportedFilter says which filter of r kelp does not implement, or "".
func unsupportedFilter(r *gatewayv1.HTTPRoute) string {
	ok := func(fs []gatewayv1.HTTPRouteFilter, backend bool) string {
		for _, f := range fs {
			switch f.Type {
			case gatewayv1.HTTPRouteFilterRequestHeaderModifier, gatewayv1.HTTPRouteFilterResponseHeaderModifier:
			case gatewayv1.HTTPRouteFilterRequestRedirect, gatewayv1.HTTPRouteFilterURLRewrite:
				if !backend {
					continue
				}
				fallthrough
			default:
				return fmt.Sprintf("kelp does not implement the filter %s here: use RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect or URLRewrite on rules, header modifiers on backendRefs", f.Type)
			}
		}
		return ""
	}
	for _, rule := range r.Spec.Rules {
		if msg := ok(rule.Filters, false); msg != "" {
			return msg
		}
		for _, b := range rule.BackendRefs {
			if msg := ok(b.Filters, true); msg != "" {
				return msg
			}
		}
	}
	return ""
}

// backends resolves a rule's backendRefs; the first failure goes to bad.
func (c *compiler) backends(r *gatewayv1.HTTPRoute, rule gatewayv1.HTTPRouteRule, bad *refs) []Backend {
	fail := func(reason gatewayv1.RouteConditionReason, msg string) {
		if bad.reason == "" {
			bad.reason, bad.msg = string(reason), msg
		}
	}
	var out []Backend
	for _, ref := range rule.BackendRefs {
		b := Backend{Weight: defaultWeight, Invalid: true}
		if ref.Weight != nil {
			b.Weight = *ref.Weight
		}
		b.Request, b.Response = headerFilters(ref.Filters)
		ns := r.Namespace
		if ref.Namespace != nil {
			ns = string(*ref.Namespace)
		}
		svc := c.services[types.NamespacedName{Namespace: ns, Name: string(ref.Name)}]
		switch {
		case (ref.Group != nil && *ref.Group != "" && *ref.Group != "core") || (ref.Kind != nil && *ref.Kind != kindService):
			fail(gatewayv1.RouteReasonInvalidKind, fmt.Sprintf("backendRef %s: kelp proxies to Services only (group \"\", kind Service)", ref.Name))
		case ns != r.Namespace && !c.granted(gatewayv1.GroupName, kindHTTPRoute, r.Namespace, "", kindService, ns, string(ref.Name)):
			fail(gatewayv1.RouteReasonRefNotPermitted, fmt.Sprintf("backendRef %s/%s: the Service is in another namespace and no ReferenceGrant there lets HTTPRoutes of %s refer to it", ns, ref.Name, r.Namespace))
		case svc == nil:
			fail(gatewayv1.RouteReasonBackendNotFound, fmt.Sprintf("backendRef %s/%s: the Service does not exist", ns, ref.Name))
		case ref.Port == nil:
			fail(gatewayv1.RouteReasonUnsupportedValue, fmt.Sprintf("backendRef %s/%s: a Service backend needs its port", ns, ref.Name))
		default:
			i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == *ref.Port })
			if i < 0 {
				fail(gatewayv1.RouteReasonBackendNotFound, fmt.Sprintf("backendRef %s/%s: the Service has no port %d", ns, ref.Name, *ref.Port))
				break
			}
			b.Invalid = false
			b.Namespace, b.Service, b.PortName, b.Port = ns, svc.Name, svc.Spec.Ports[i].Name, *ref.Port
		}
		if b.Weight > 0 {
			out = append(out, b)
		}
	}
	return out
}

func headerFilters(fs []gatewayv1.HTTPRouteFilter) (req, resp *HeaderFilter) {
	for _, f := range fs {
		switch {
		case f.Type == gatewayv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil:
			req = headerFilter(f.RequestHeaderModifier)
		case f.Type == gatewayv1.HTTPRouteFilterResponseHeaderModifier && f.ResponseHeaderModifier != nil:
			resp = headerFilter(f.ResponseHeaderModifier)
		}
	}
	return req, resp
}

func headerFilter(f *gatewayv1.HTTPHeaderFilter) *HeaderFilter {
	out := &HeaderFilter{Remove: f.Remove}
	for _, h := range f.Set {
		out.Set = append(out.Set, Header{Name: string(h.Name), Value: h.Value})
	}
	for _, h := range f.Add {
		out.Add = append(out.Add, Header{Name: string(h.Name), Value: h.Value})
	}
	return out
}

// attach attaches r to the listeners of one parentRef.
func (c *compiler) attach(r *gatewayv1.HTTPRoute, ref gatewayv1.ParentReference, ls []*listener, backends [][]Backend) (ok bool, reason, msg string) {
	var named []*listener
	for _, l := range ls {
		if (ref.SectionName == nil || *ref.SectionName == l.spec.Name) && (ref.Port == nil || *ref.Port == l.spec.Port) {
			named = append(named, l)
		}
	}
	if len(named) == 0 {
		return false, string(gatewayv1.RouteReasonNoMatchingParent), "the Gateway has no listener of the parentRef's sectionName and port"
	}
	var allowed []*listener
	for _, l := range named {
		if l.accepted && slices.ContainsFunc(l.kinds, func(k gatewayv1.RouteGroupKind) bool { return k.Kind == kindHTTPRoute }) && c.namespaceAllowed(l, r.Namespace) {
			allowed = append(allowed, l)
		}
	}
	if len(allowed) == 0 {
		return false, string(gatewayv1.RouteReasonNotAllowedByListeners), fmt.Sprintf("no listener of the Gateway allows HTTPRoutes from namespace %s", r.Namespace)
	}
	attached := false
	for _, l := range allowed {
		hosts, ok := intersect(l.hostname, r.Spec.Hostnames)
		if !ok {
			continue
		}
		attached = true
		l.attached++
		for ri, rule := range r.Spec.Rules {
			l.addRule(r, ri, rule, hosts, backends[ri])
		}
	}
	if !attached {
		return false, string(gatewayv1.RouteReasonNoMatchingListenerHostname), "no listener of the Gateway has a hostname that matches the route's hostnames"
	}
	return true, string(gatewayv1.RouteReasonAccepted), "the route is attached"
}

func (c *compiler) namespaceAllowed(l *listener, ns string) bool {
	from := gatewayv1.NamespacesFromSame
	var rn *gatewayv1.RouteNamespaces
	if l.spec.AllowedRoutes != nil {
		rn = l.spec.AllowedRoutes.Namespaces
	}
	if rn != nil && rn.From != nil {
		from = *rn.From
	}
	switch from {
	case gatewayv1.NamespacesFromAll:
		return true
	case gatewayv1.NamespacesFromSame:
		return ns == l.gw.Namespace
	case gatewayv1.NamespacesFromSelector:
		if rn.Selector == nil {
			return false
		}
		sel, err := metav1.LabelSelectorAsSelector(rn.Selector)
		return err == nil && sel.Matches(c.nsLabels[ns])
	}
	return false
}

// addRule adds the matches of one rule of r to the listener.
func (l *listener) addRule(r *gatewayv1.HTTPRoute, ri int, rule gatewayv1.HTTPRouteRule, hosts []string, backends []Backend) {
	matches := rule.Matches
	if len(matches) == 0 {
		matches = []gatewayv1.HTTPRouteMatch{{}}
	}
	for mi, m := range matches {
		rt := Route{Name: r.Namespace + "/" + r.Name, Hostnames: hosts, Path: PathMatch{Type: PathPrefix, Value: "/"}, Backends: backends}
		if m.Path != nil {
			if m.Path.Type != nil {
				rt.Path.Type = string(*m.Path.Type)
			}
			if m.Path.Value != nil {
				rt.Path.Value = *m.Path.Value
			}
		}
		if m.Method != nil {
			rt.Method = string(*m.Method)
		}
		for _, h := range m.Headers {
			rt.Headers = append(rt.Headers, ValueMatch{Name: string(h.Name), Value: h.Value, Regex: h.Type != nil && *h.Type == gatewayv1.HeaderMatchRegularExpression})
		}
		for _, q := range m.QueryParams {
			rt.Query = append(rt.Query, ValueMatch{Name: string(q.Name), Value: q.Value, Regex: q.Type != nil && *q.Type == gatewayv1.QueryParamMatchRegularExpression})
		}
		rt.Request, rt.Response = headerFilters(rule.Filters)
		for _, f := range rule.Filters {
			switch {
			case f.Type == gatewayv1.HTTPRouteFilterRequestRedirect && f.RequestRedirect != nil:
				rt.Redirect = redirect(f.RequestRedirect)
			case f.Type == gatewayv1.HTTPRouteFilterURLRewrite && f.URLRewrite != nil:
				rt.Rewrite = &Rewrite{Path: pathModifier(f.URLRewrite.Path)}
				if f.URLRewrite.Hostname != nil {
					rt.Rewrite.Hostname = string(*f.URLRewrite.Hostname)
				}
			}
		}
		l.routes = append(l.routes, rt)
		l.order = append(l.order, routeOrder{
			exact:   rt.Path.Type == PathExact,
			pathLen: len(rt.Path.Value),
			method:  rt.Method != "",
			headers: len(rt.Headers),
			query:   len(rt.Query),
			created: r.CreationTimestamp,
			key:     rt.Name,
			rule:    ri,
			match:   mi,
		})
	}
}

func redirect(f *gatewayv1.HTTPRequestRedirectFilter) *Redirect {
	out := &Redirect{Status: defaultRedirectStatus, Path: pathModifier(f.Path)}
	if f.Scheme != nil {
		out.Scheme = *f.Scheme
	}
	if f.Hostname != nil {
		out.Hostname = string(*f.Hostname)
	}
	if f.Port != nil {
		out.Port = *f.Port
	}
	if f.StatusCode != nil {
		out.Status = *f.StatusCode
	}
	return out
}

func pathModifier(m *gatewayv1.HTTPPathModifier) *PathModifier {
	if m == nil {
		return nil
	}
	switch m.Type {
	case gatewayv1.FullPathHTTPPathModifier:
		return &PathModifier{Full: ptr(ptrOr(m.ReplaceFullPath, "/"))}
	case gatewayv1.PrefixMatchHTTPPathModifier:
		return &PathModifier{Prefix: ptr(ptrOr(m.ReplacePrefixMatch, "/"))}
	}
	return nil
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// intersect narrows a route's hostnames to a listener's hostname (empty:
// any); ok is false when they have none in common. Empty hosts: any.
func intersect(listener string, route []gatewayv1.Hostname) (hosts []string, ok bool) {
	if len(route) == 0 {
		if listener == "" {
			return nil, true
		}
		return []string{listener}, true
	}
	for _, h := range route {
		r := strings.ToLower(string(h))
		switch {
		case listener == "" || hostMatches(listener, r):
			hosts = append(hosts, r)
		case hostMatches(r, listener):
			hosts = append(hosts, listener)
		}
	}
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	return hosts, len(hosts) > 0
}

// hostMatches says whether pattern (a name or *.suffix) covers host (a
// name or a wildcard); a wildcard matches one label or more.
func hostMatches(pattern, host string) bool {
	if pattern == host {
		return true
	}
	suffix, ok := strings.CutPrefix(pattern, "*")
	return ok && strings.HasSuffix(host, suffix) && len(strings.TrimPrefix(host, "*")) > len(suffix)
}

// configOf builds the data path's ports from the programmed listeners,
// each on the addresses it is served on. Listeners of one hostname on a
// port (of one namespace: see claimHostnames) share its routes; the
// certificate is the first listener's, the oldest.
func (c *compiler) configOf(all []*listener) Config {
	type hostKey struct {
		servedPort
		name string
	}
	ports := map[servedPort]*Port{}
	orders := map[hostKey][]routeOrder{}
	hosts := map[hostKey]*Host{}
	cfg := Config{Certs: map[string]Cert{}}
	for _, l := range all {
		if !l.programmed {
			continue
		}
		if l.cert != nil {
			cfg.Certs[l.certID] = *l.cert
		}
		for _, pk := range c.portsOf(l) {
			if ports[pk] == nil {
				ports[pk] = &Port{Address: pk.address, Port: pk.port, Protocol: string(l.spec.Protocol)}
			}
			k := hostKey{pk, l.hostname}
			h := hosts[k]
			if h == nil {
				h = &Host{Hostname: l.hostname, CertID: l.certID}
				hosts[k] = h
			}
			h.Routes = append(h.Routes, l.routes...)
			orders[k] = append(orders[k], l.order...)
		}
	}
	for pk, p := range ports {
		for k, h := range hosts {
			if k.servedPort != pk {
				continue
			}
			h.Routes = sortRoutes(h.Routes, orders[k])
			p.Hosts = append(p.Hosts, *h)
		}
		slices.SortFunc(p.Hosts, func(a, b Host) int { return cmp.Compare(a.Hostname, b.Hostname) })
		cfg.Ports = append(cfg.Ports, *p)
	}
	slices.SortFunc(cfg.Ports, func(a, b Port) int { return cmp.Or(cmp.Compare(a.Port, b.Port), cmp.Compare(a.Address, b.Address)) })
	if len(cfg.Certs) == 0 {
		cfg.Certs = nil
	}
	return cfg
}

// servedPort is a listening port of one address; an empty address is the
// nodes' own addresses.
type servedPort struct {
	address string
	port    int32
}

// portsOf are the ports l is served on: its port on each of its
// Gateway's own addresses, or on the nodes' addresses if the Gateway is
// not to have any; none if it is to have some and has none yet.
func (c *compiler) portsOf(l *listener) []servedPort {
	a := c.addressing[nameOf(l.gw)]
	if a == nil || len(a.addrs) == 0 {
		if c.unaddressed(l.gw) {
			return nil
		}
		return []servedPort{{"", l.spec.Port}}
	}
	out := make([]servedPort, 0, len(a.addrs))
	for _, ip := range a.addrs {
		out = append(out, servedPort{ip.String(), l.spec.Port})
	}
	return out
}

// sortRoutes orders routes by the spec's precedence: an exact path, then
// the longest path, a method, the most headers, the most query
// parameters, the oldest route, its namespace and name, then rule and
// match order within it. Duplicates (one route attached twice through
// listeners of one hostname) are dropped.
func sortRoutes(routes []Route, order []routeOrder) []Route {
	idx := make([]int, len(routes))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		x, y := order[a], order[b]
		if x.exact != y.exact {
			if x.exact {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(y.pathLen, x.pathLen); c != 0 {
			return c
		}
		if x.method != y.method {
			if x.method {
				return -1
			}
			return 1
		}
		if c := cmp.Or(cmp.Compare(y.headers, x.headers), cmp.Compare(y.query, x.query)); c != 0 {
			return c
		}
		if !x.created.Equal(&y.created) {
			if x.created.Before(&y.created) {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(x.key, y.key), cmp.Compare(x.rule, y.rule), cmp.Compare(x.match, y.match))
	})
	out := make([]Route, 0, len(routes))
	var last *routeOrder
	for _, i := range idx {
		if last != nil && *last == order[i] {
			continue
		}
		out = append(out, routes[i])
		last = &order[i]
	}
	return out
}
