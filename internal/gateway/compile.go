package gateway

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/kelp-dev/kelp/internal/config"
)

// ControllerName is the controllerName of the GatewayClasses kelp
// implements.
const ControllerName gatewayv1.GatewayController = "kelp.io/gateway"

// ClassName is the GatewayClass kelp applies at every start.
const ClassName = "kelp"

// UnavailablePortsAnnotation is the Node annotation by which a node's data
// path says which ports it could not listen on (comma-separated), so that
// their listeners are not reported as programmed.
const UnavailablePortsAnnotation = AnnotationPrefix + "unavailable-ports"

// NetworksAnnotation is the Node annotation by which a node's data path
// says which networks its interfaces are on (CIDRs, comma-separated), so
// that it is given only Gateway addresses it can hold there.
const NetworksAnnotation = AnnotationPrefix + "networks"

// InUseAnnotation is the Node annotation by which a node's data path says
// which Gateway addresses it was given and found in use by another
// machine on their network (an ARP probe answered, IPv6 duplicate address
// detection failed), comma-separated: it is not given them again, and an
// address every node that may hold it found in use is given to no Gateway.
const InUseAnnotation = AnnotationPrefix + "addresses-in-use"

// AnnotationPrefix is the prefix of the Node annotations the data path
// writes on its own Node.
const AnnotationPrefix = "gateway.kelp.io/"

const (
	kindGateway           = "Gateway"
	kindHTTPRoute         = "HTTPRoute"
	kindService           = "Service"
	kindSecret            = "Secret"
	defaultRedirectStatus = 302
	defaultWeight         = 1
)

// Objects are what Compile reads: the API objects that decide the data
// path. Nil entries are not allowed.
type Objects struct {
	GatewayClasses  []*gatewayv1.GatewayClass
	Gateways        []*gatewayv1.Gateway
	HTTPRoutes      []*gatewayv1.HTTPRoute
	ReferenceGrants []*gatewayv1beta1.ReferenceGrant
	Services        []*corev1.Service
	Secrets         []*corev1.Secret
	Namespaces      []*corev1.Namespace
	// Ingresses of the class kelp are served beside the Gateways.
	Ingresses []*networkingv1.Ingress
	// Nodes serve every Gateway: their addresses are the addresses of
	// the Gateways without their own, one of them holds each Gateway
	// address, and a port one of them cannot listen on is unavailable.
	Nodes []*corev1.Node
	// AddressRanges are not an API object but the server's
	// --gateway-address-range: with them, every Gateway gets addresses
	// of its own. Held are the holders of the last Config published, which
	// keep their addresses while they may.
	AddressRanges []config.AddressRange
	Held          []HeldAddress
}

// Status is the status Compile computed for the objects kelp handles.
// Conditions carry no LastTransitionTime: the writer keeps the one of a
// condition that did not change.
type Status struct {
	GatewayClasses map[string]gatewayv1.GatewayClassStatus
	Gateways       map[types.NamespacedName]gatewayv1.GatewayStatus
	// HTTPRoutes hold kelp's entries of each route's status.parents.
	HTTPRoutes map[types.NamespacedName][]gatewayv1.RouteParentStatus
	// Ingresses hold the addresses of the Ingresses of the class kelp.
	Ingresses map[types.NamespacedName][]networkingv1.IngressLoadBalancerIngress
}

// listener is one listener of a Gateway as Compile sees it.
type listener struct {
	gw       *gatewayv1.Gateway
	spec     gatewayv1.Listener
	hostname string
	// accepted: the listener is usable; with programmed, it serves.
	accepted, programmed        bool
	acceptedReason, acceptedMsg string
	resolved                    bool
	resolvedReason, resolvedMsg string
	conflicted, conflictMsg     string // the reason, or empty
	// unserved names the nodes that cannot serve the listener although
	// others do (its port is in use there); full says the configuration
	// had no room left for it.
	unserved []string
	full     bool
	kinds    []gatewayv1.RouteGroupKind
	// cert is the HTTPS listener's certificate, certID the name it is
	// published under (the Secret's namespace/name).
	cert     *Cert
	certID   string
	attached int32
	routes   []Route
	order    []routeOrder
}

// routeOrder is what orders a Route among others on a host: the spec's
// precedence rules after the hostname.
type routeOrder struct {
	exact       bool
	pathLen     int
	method      bool
	headers     int
	query       int
	created     metav1.Time
	key         string
	rule, match int
}

type compiler struct {
	in       Objects
	services map[types.NamespacedName]*corev1.Service
	secrets  map[types.NamespacedName]*corev1.Secret
	nsLabels map[string]labels.Set
	// unavailable are the ports a node could not listen on, with the node.
	unavailable map[int32][]string
	// addressing is what each Gateway of kelp's got of the address
	// ranges; held says which node holds each address.
	addressing map[types.NamespacedName]*addressing
	held       map[netip.Addr]string
}

// Compile computes the data path's configuration and the status of every
// GatewayClass of kelp's controllerName, of the Gateways of those classes
// and of the HTTPRoutes attached to them. It reads nothing but objs.
func Compile(objs Objects) (Config, Status) {
	c := compiler{
		in:          objs,
		services:    map[types.NamespacedName]*corev1.Service{},
		secrets:     map[types.NamespacedName]*corev1.Secret{},
		nsLabels:    map[string]labels.Set{},
		unavailable: map[int32][]string{},
	}
	for _, s := range objs.Services {
		c.services[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}
	for _, s := range objs.Secrets {
		c.secrets[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}
	for _, n := range objs.Namespaces {
		c.nsLabels[n.Name] = labels.Set(n.Labels)
	}
	for _, n := range objs.Nodes {
		for p := range strings.SplitSeq(n.Annotations[UnavailablePortsAnnotation], ",") {
			if port, err := strconv.ParseInt(strings.TrimSpace(p), 10, 32); err == nil {
				c.unavailable[int32(port)] = append(c.unavailable[int32(port)], n.Name)
			}
		}
	}
	st := Status{
		GatewayClasses: map[string]gatewayv1.GatewayClassStatus{},
		Gateways:       map[types.NamespacedName]gatewayv1.GatewayStatus{},
		HTTPRoutes:     map[types.NamespacedName][]gatewayv1.RouteParentStatus{},
		Ingresses:      map[types.NamespacedName][]networkingv1.IngressLoadBalancerIngress{},
	}
	ours := map[string]bool{}
	for _, gc := range objs.GatewayClasses {
		if gc.Spec.ControllerName != ControllerName {
			continue
		}
		ours[gc.Name] = true
		st.GatewayClasses[gc.Name] = gatewayv1.GatewayClassStatus{
			Conditions: []metav1.Condition{
				cond(gatewayv1.GatewayClassConditionStatusAccepted, true, string(gatewayv1.GatewayClassReasonAccepted), "kelp serves Gateways of this class on every node", gc.Generation),
			},
			SupportedFeatures: supportedFeatures(len(objs.AddressRanges) > 0),
		}
	}

	var gateways []*gatewayv1.Gateway
	for _, gw := range objs.Gateways {
		if ours[string(gw.Spec.GatewayClassName)] {
			gateways = append(gateways, gw)
		}
	}
	slices.SortFunc(gateways, olderFirst)
	c.addressing = assign(objs.AddressRanges, gateways, objs.Nodes)
	c.held = map[netip.Addr]string{}
	was := map[string]string{}
	for _, h := range objs.Held {
		was[h.Address] = h.Node
	}
	byGateway := map[types.NamespacedName][]*listener{}
	var all []*listener
	for _, gw := range gateways {
		ls := c.listeners(gw)
		byGateway[nameOf(gw)] = ls
		all = append(all, ls...)
		free := c.freeFor(ls)
		for _, ip := range c.addressing[nameOf(gw)].addrs {
			node, ok := chooseHolder(ip, free, was[ip.String()])
			if !ok {
				node, ok = chooseHolder(ip, objs.Nodes, was[ip.String()])
			}
			if ok {
				c.held[ip] = node
			}
		}
	}
	ingresses := c.ingressListeners(objs.Ingresses)
	all = append(all, ingresses...)
	conflicts(all)
	c.claimHostnames(all)
	for _, l := range all {
		c.portInUse(l)
		l.programmed = l.accepted && l.resolved && l.conflicted == "" && !c.unaddressed(l.gw)
	}

	routes := slices.Clone(objs.HTTPRoutes)
	slices.SortFunc(routes, olderFirst)
	for _, r := range routes {
		if parents := c.route(r, byGateway); len(parents) > 0 {
			st.HTTPRoutes[nameOf(r)] = parents
		}
	}
	c.fit(all)

	for _, gw := range gateways {
		st.Gateways[nameOf(gw)] = c.gatewayStatus(gw, byGateway[nameOf(gw)])
	}
	for _, ing := range objs.Ingresses {
		if isKelpIngress(ing) {
			st.Ingresses[nameOf(ing)] = c.ingressStatus(ing, ingresses)
		}
	}
	cfg := c.configOf(all)
	for ip, node := range c.held {
		cfg.Addresses = append(cfg.Addresses, HeldAddress{Address: ip.String(), Node: node})
	}
	slices.SortFunc(cfg.Addresses, func(a, b HeldAddress) int { return cmp.Compare(a.Address, b.Address) })
	return cfg, st
}

// ownAddresses says whether gw is to have addresses of its own: when the
// server has address ranges, or when the Gateway asks for some.
func (c *compiler) ownAddresses(gw *gatewayv1.Gateway) bool {
	return len(c.in.AddressRanges) > 0 || len(gw.Spec.Addresses) > 0
}

// unaddressed says whether gw is to have addresses of its own and has
// none: its listeners are served nowhere.
func (c *compiler) unaddressed(gw *gatewayv1.Gateway) bool {
	a := c.addressing[nameOf(gw)]
	return a != nil && c.ownAddresses(gw) && len(a.addrs) == 0
}

// supportedFeatures are the conformance features kelp implements (names
// of sigs.k8s.io/gateway-api/pkg/features), in alphabetical order; those of
// spec.addresses when the server has address ranges.
func supportedFeatures(addressRanges bool) []gatewayv1.SupportedFeature {
	names := []gatewayv1.FeatureName{
		"Gateway", "GatewayHTTPListenerIsolation", "GatewayHTTPSListenerDetectMisdirectedRequests", "GatewayPort8080",
		"HTTPRoute", "HTTPRoute303RedirectStatusCode", "HTTPRoute307RedirectStatusCode", "HTTPRoute308RedirectStatusCode",
		"HTTPRouteBackendRequestHeaderModification", "HTTPRouteHostRewrite", "HTTPRouteMethodMatching",
		"HTTPRouteParentRefPort", "HTTPRoutePathRedirect", "HTTPRoutePathRewrite", "HTTPRoutePortRedirect",
		"HTTPRouteQueryParamMatching", "HTTPRouteResponseHeaderModification", "HTTPRouteSchemeRedirect",
		"ReferenceGrant",
	}
	if addressRanges {
		names = append(names, "GatewayAddressEmpty", "GatewayStaticAddresses")
	}
	slices.Sort(names)
	out := make([]gatewayv1.SupportedFeature, len(names))
	for i, n := range names {
		out[i] = gatewayv1.SupportedFeature{Name: n}
	}
	return out
}

// olderFirst orders objects as the spec's tie-breaks do: the oldest, then
// by namespace and name.
func olderFirst[T metav1.Object](a, b T) int {
	ta, tb := a.GetCreationTimestamp(), b.GetCreationTimestamp()
	if !ta.Equal(&tb) {
		if ta.Before(&tb) {
			return -1
		}
		return 1
	}
	return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
}

func nameOf(o metav1.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
}

func cond[T ~string](t T, ok bool, reason, msg string, gen int64) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: string(t), Status: s, Reason: reason, Message: msg, ObservedGeneration: gen}
}

var httpRouteKind = gatewayv1.RouteGroupKind{Group: ptr(gatewayv1.Group(gatewayv1.GroupName)), Kind: kindHTTPRoute}

func ptr[T any](v T) *T { return &v }

// listeners checks each listener of gw on its own.
func (c *compiler) listeners(gw *gatewayv1.Gateway) []*listener {
	var out []*listener
	for _, spec := range gw.Spec.Listeners {
		l := &listener{gw: gw, spec: spec, accepted: true, resolved: true, kinds: []gatewayv1.RouteGroupKind{}}
		if spec.Hostname != nil {
			l.hostname = strings.ToLower(string(*spec.Hostname))
		}
		out = append(out, l)
		switch spec.Protocol {
		case gatewayv1.HTTPProtocolType, gatewayv1.HTTPSProtocolType:
		default:
			l.accepted = false
			l.acceptedReason = string(gatewayv1.ListenerReasonUnsupportedProtocol)
			l.acceptedMsg = fmt.Sprintf("protocol %s is not supported: kelp serves HTTP and HTTPS", spec.Protocol)
			continue
		}
		l.kinds, l.resolved = routeKinds(spec.AllowedRoutes)
		if !l.resolved {
			l.resolvedReason = string(gatewayv1.ListenerReasonInvalidRouteKinds)
			l.resolvedMsg = "kelp supports only HTTPRoute (group gateway.networking.k8s.io) on HTTP and HTTPS listeners"
		}
		if spec.Protocol == gatewayv1.HTTPSProtocolType {
			c.tls(l)
		}
	}
	return out
}

// routeKinds are the kinds of route a listener accepts, of those kelp
// supports; ok is false when it names one kelp does not.
func routeKinds(allowed *gatewayv1.AllowedRoutes) (kinds []gatewayv1.RouteGroupKind, ok bool) {
	if allowed == nil || len(allowed.Kinds) == 0 {
		return []gatewayv1.RouteGroupKind{httpRouteKind}, true
	}
	kinds, ok = []gatewayv1.RouteGroupKind{}, true
	for _, k := range allowed.Kinds {
		if (k.Group == nil || *k.Group == gatewayv1.GroupName) && k.Kind == kindHTTPRoute {
			if !slices.ContainsFunc(kinds, func(x gatewayv1.RouteGroupKind) bool { return x.Kind == kindHTTPRoute }) {
				kinds = append(kinds, httpRouteKind)
			}
			continue
		}
		ok = false
	}
	return kinds, ok
}

// tls resolves the certificate of an HTTPS listener.
func (c *compiler) tls(l *listener) {
	fail := func(reason, msg string) {
		l.resolved = false
		l.resolvedReason, l.resolvedMsg = reason, msg
	}
	t := l.spec.TLS
	if t == nil || (t.Mode != nil && *t.Mode != gatewayv1.TLSModeTerminate) {
		if t != nil && t.Mode != nil {
			l.accepted = false
			l.acceptedReason = string(gatewayv1.ListenerReasonUnsupportedValue)
			l.acceptedMsg = fmt.Sprintf("TLS mode %s is not supported on HTTPS listeners: use Terminate", *t.Mode)
		}
		fail(string(gatewayv1.ListenerReasonInvalidCertificateRef), "an HTTPS listener needs tls.certificateRefs")
		return
	}
	if len(t.CertificateRefs) == 0 {
		fail(string(gatewayv1.ListenerReasonInvalidCertificateRef), "an HTTPS listener needs tls.certificateRefs")
		return
	}
	ref := t.CertificateRefs[0]
	ns := l.gw.Namespace
	if ref.Namespace != nil {
		ns = string(*ref.Namespace)
	}
	if (ref.Group != nil && *ref.Group != "") || (ref.Kind != nil && *ref.Kind != kindSecret) {
		fail(string(gatewayv1.ListenerReasonInvalidCertificateRef), fmt.Sprintf("certificateRef %s: kelp reads certificates from Secrets only (group \"\", kind Secret)", ref.Name))
		return
	}
	if ns != l.gw.Namespace && !c.granted(gatewayv1.GroupName, kindGateway, l.gw.Namespace, "", kindSecret, ns, string(ref.Name)) {
		fail(string(gatewayv1.ListenerReasonRefNotPermitted), fmt.Sprintf("the Secret %s/%s is in another namespace and no ReferenceGrant there lets Gateways of %s refer to it", ns, ref.Name, l.gw.Namespace))
		return
	}
	s := c.secrets[types.NamespacedName{Namespace: ns, Name: string(ref.Name)}]
	if s == nil {
		fail(string(gatewayv1.ListenerReasonInvalidCertificateRef), fmt.Sprintf("no Secret %s/%s of type kubernetes.io/tls: make one with kubectl -n %[1]s create secret tls %[2]s --cert=... --key=...", ns, ref.Name))
		return
	}
	certPEM, keyPEM := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	if size := len(certPEM) + len(keyPEM); size > maxCertBytes {
		fail(string(gatewayv1.ListenerReasonInvalidCertificateRef), fmt.Sprintf("the Secret %s/%s holds %d KiB of certificate and key, more than the %d KiB kelp serves: put only the certificate, its intermediates and its key in it", ns, ref.Name, size/1024, maxCertBytes/1024))
		return
	}
	if err := checkCert(certPEM, keyPEM); err != nil {
		fail(string(gatewayv1.ListenerReasonInvalidCertificateRef), fmt.Sprintf("the Secret %s/%s holds no usable certificate (%v): put a PEM certificate and its key in tls.crt and tls.key", ns, ref.Name, err))
		return
	}
	l.cert = &Cert{Cert: certPEM, Key: keyPEM}
	l.certID = ns + "/" + string(ref.Name)
}

// maxCertBytes bounds one certificate chain and its key: a real chain
// with its key is a few KiB, and every node holds each one.
const maxCertBytes = 64 << 10

func checkCert(certPEM, keyPEM []byte) error {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	_, err = x509.ParseCertificate(pair.Certificate[0])
	return err
}

// granted says whether a ReferenceGrant in toNS lets objects of fromGroup
// and fromKind in fromNS refer to toKind (group toGroup) named toName.
func (c *compiler) granted(fromGroup, fromKind, fromNS, toGroup, toKind, toNS, toName string) bool {
	for _, g := range c.in.ReferenceGrants {
		if g.Namespace != toNS {
			continue
		}
		from := slices.ContainsFunc(g.Spec.From, func(f gatewayv1beta1.ReferenceGrantFrom) bool {
			return string(f.Group) == fromGroup && string(f.Kind) == fromKind && string(f.Namespace) == fromNS
		})
		to := slices.ContainsFunc(g.Spec.To, func(t gatewayv1beta1.ReferenceGrantTo) bool {
			return string(t.Group) == toGroup && string(t.Kind) == toKind && (t.Name == nil || *t.Name == "" || string(*t.Name) == toName)
		})
		if from && to {
			return true
		}
	}
	return false
}

// conflicts marks the listeners that share a port with another of another
// protocol, or a port, protocol and hostname within one Gateway. Between
// Gateways, the oldest keeps a port's protocol.
func conflicts(all []*listener) {
	protocol := map[int32]gatewayv1.ProtocolType{}
	for _, l := range all {
		if !l.accepted {
			continue
		}
		p, ok := protocol[l.spec.Port]
		if !ok {
			protocol[l.spec.Port] = l.spec.Protocol
		} else if p != l.spec.Protocol {
			l.conflicted = string(gatewayv1.ListenerReasonProtocolConflict)
		}
	}
	seen := map[string]int{}
	for _, l := range all {
		if l.accepted && l.conflicted == "" {
			seen[fmt.Sprintf("%s/%s/%d/%s", l.gw.Namespace, l.gw.Name, l.spec.Port, l.hostname)]++
		}
	}
	for _, l := range all {
		if l.accepted && l.conflicted == "" && seen[fmt.Sprintf("%s/%s/%d/%s", l.gw.Namespace, l.gw.Name, l.spec.Port, l.hostname)] > 1 {
			l.conflicted = string(gatewayv1.ListenerReasonHostnameConflict)
		}
	}
}

func (c *compiler) gatewayStatus(gw *gatewayv1.Gateway, ls []*listener) gatewayv1.GatewayStatus {
	gen := gw.Generation
	st := gatewayv1.GatewayStatus{}
	valid, programmed := 0, 0
	for _, l := range ls {
		ok := l.accepted && l.resolved && l.conflicted == ""
		if ok {
			valid++
		}
		if l.programmed {
			programmed++
		}
		acceptedReason, acceptedMsg := string(gatewayv1.ListenerReasonAccepted), "the listener is valid"
		if !l.accepted {
			acceptedReason, acceptedMsg = l.acceptedReason, l.acceptedMsg
		}
		resolvedReason, resolvedMsg := string(gatewayv1.ListenerReasonResolvedRefs), "every reference is resolved"
		if !l.resolved {
			resolvedReason, resolvedMsg = l.resolvedReason, l.resolvedMsg
		}
		conflict := cond(gatewayv1.ListenerConditionConflicted, false, string(gatewayv1.ListenerReasonNoConflicts), "no other listener conflicts with this one", gen)
		if l.conflicted != "" {
			conflict = cond(gatewayv1.ListenerConditionConflicted, true, l.conflicted, cmp.Or(l.conflictMsg, fmt.Sprintf("another listener on port %d conflicts with this one (%s)", l.spec.Port, l.conflicted)), gen)
		}
		programmedReason, programmedMsg := string(gatewayv1.ListenerReasonProgrammed), "every node serves the listener"
		switch {
		case l.programmed && len(l.unserved) > 0:
			programmedMsg = fmt.Sprintf("served by every node but %s, where port %d is in use", strings.Join(l.unserved, ", "), l.spec.Port)
		case l.programmed:
		case l.full:
			programmedReason, programmedMsg = string(gatewayv1.ListenerReasonInvalid), fullMsg
		case ok && c.unaddressed(gw):
			programmedReason, programmedMsg = string(gatewayv1.ListenerReasonPending), "the Gateway has no address: see its Programmed condition"
		default:
			programmedReason, programmedMsg = string(gatewayv1.ListenerReasonInvalid), "the listener is not served: see its other conditions"
		}
		st.Listeners = append(st.Listeners, gatewayv1.ListenerStatus{
			Name:           l.spec.Name,
			SupportedKinds: l.kinds,
			AttachedRoutes: l.attached,
			Conditions: []metav1.Condition{
				cond(gatewayv1.ListenerConditionAccepted, l.accepted, acceptedReason, acceptedMsg, gen),
				cond(gatewayv1.ListenerConditionResolvedRefs, l.resolved, resolvedReason, resolvedMsg, gen),
				conflict,
				cond(gatewayv1.ListenerConditionProgrammed, l.programmed, programmedReason, programmedMsg, gen),
			},
		})
	}
	own := c.addressing[nameOf(gw)]
	switch {
	case own.unsupported != "":
		st.Conditions = append(st.Conditions, cond(gatewayv1.GatewayConditionAccepted, false, string(gatewayv1.GatewayReasonUnsupportedAddress), own.unsupported, gen))
	case valid == len(ls):
		st.Conditions = append(st.Conditions, cond(gatewayv1.GatewayConditionAccepted, true, string(gatewayv1.GatewayReasonAccepted), "the Gateway is valid", gen))
	default:
		st.Conditions = append(st.Conditions, cond(gatewayv1.GatewayConditionAccepted, valid > 0, string(gatewayv1.GatewayReasonListenersNotValid), fmt.Sprintf("%d of %d listeners are not valid: see their conditions", len(ls)-valid, len(ls)), gen))
	}
	programmedTrue := cond(gatewayv1.GatewayConditionProgrammed, true, string(gatewayv1.GatewayReasonProgrammed), "every node serves the Gateway", gen)
	if !c.ownAddresses(gw) {
		addrs := c.addresses()
		switch {
		case len(addrs) == 0:
			st.Conditions = append(st.Conditions, cond(gatewayv1.GatewayConditionProgrammed, false, string(gatewayv1.GatewayReasonAddressNotAssigned), "no node has an address yet", gen))
		case programmed == 0:
			st.Conditions = append(st.Conditions, cond(gatewayv1.GatewayConditionProgrammed, false, string(gatewayv1.GatewayReasonInvalid), "no listener is served: see their conditions", gen))
		default:
			// More would fail the status's validation; the first nodes'
			// stand for all: every node serves the Gateway.
			st.Addresses = addrs[:min(len(addrs), maxStatusAddresses)]
			st.Conditions = append(st.Conditions, programmedTrue)
		}
		return st
	}
	// The Gateway's own addresses stay in its status whatever its
	// listeners, so that it keeps them.
	var unheld []string
	for _, ip := range own.addrs {
		st.Addresses = append(st.Addresses, gatewayv1.GatewayStatusAddress{Type: ptr(gatewayv1.IPAddressType), Value: ip.String()})
		if c.held[ip] == "" {
			unheld = append(unheld, ip.String())
		}
	}
	switch {
	case own.unsupported != "":
		st.Conditions = append(st.Conditions, cond(gatewayv1.GatewayConditionProgrammed, false, string(gatewayv1.GatewayReasonInvalid), "the Gateway is not accepted: see its Accepted condition", gen))
	case own.reason != "":
		st.Conditions = append(st.Conditions, cond(gatewayv1.GatewayConditionProgrammed, false, own.reason, own.msg, gen))
	case len(unheld) > 0:
		st.Conditions = append(st.Conditions, cond(gatewayv1.GatewayConditionProgrammed, false, string(gatewayv1.GatewayReasonAddressNotAssigned),
			fmt.Sprintf("no node may hold %s: a node holds a Gateway address when it is Ready, not cordoned, not labelled %s, has an interface on the address's network that also holds its InternalIP or ExternalIP (its annotation %s), and did not find the address in use (its annotation %s)", strings.Join(unheld, ", "), excludeLabel, NetworksAnnotation, InUseAnnotation), gen))
	case programmed == 0:
		st.Conditions = append(st.Conditions, cond(gatewayv1.GatewayConditionProgrammed, false, string(gatewayv1.GatewayReasonInvalid), "no listener is served: see their conditions", gen))
	default:
		programmedTrue.Message = "the Gateway is served on its own addresses"
		st.Conditions = append(st.Conditions, programmedTrue)
	}
	return st
}

// maxStatusAddresses is as many addresses as a Gateway's status holds
// (the CRD's maxItems).
const maxStatusAddresses = 16

// addresses are the nodes' addresses a Gateway is reached at: of each
// family a node has (IPv4 and IPv6 in a dual-stack cluster), in the order
// of its addresses, its external IP of that family if it has one, else its
// internal IP.
func (c *compiler) addresses() []gatewayv1.GatewayStatusAddress {
	nodes := slices.Clone(c.in.Nodes)
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	var out []gatewayv1.GatewayStatusAddress
	for _, n := range nodes {
		for _, ip := range nodeAddresses(n) {
			out = append(out, gatewayv1.GatewayStatusAddress{Type: ptr(gatewayv1.IPAddressType), Value: ip.String()})
		}
	}
	return out
}

// nodeAddresses are the addresses of n a Gateway is reached at, one of
// each family.
func nodeAddresses(n *corev1.Node) []netip.Addr {
	type pick struct{ internal, external netip.Addr }
	var families []*pick // by the order of the node's addresses
	byFamily := map[bool]*pick{}
	for _, a := range n.Status.Addresses {
		ip, err := netip.ParseAddr(a.Address)
		if err != nil || (a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP) {
			continue
		}
		p := byFamily[ip.Is4()]
		if p == nil {
			p = &pick{}
			byFamily[ip.Is4()] = p
			families = append(families, p)
		}
		switch {
		case a.Type == corev1.NodeExternalIP && !p.external.IsValid():
			p.external = ip
		case a.Type == corev1.NodeInternalIP && !p.internal.IsValid():
			p.internal = ip
		}
	}
	var out []netip.Addr
	for _, p := range families {
		if p.external.IsValid() {
			out = append(out, p.external)
		} else {
			out = append(out, p.internal)
		}
	}
	return out
}
