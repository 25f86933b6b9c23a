package gateway

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// What each listener may claim of what all share: a hostname on a port,
// a node's port, room in the published Config.

// claimHostnames gives each hostname on a port of an address to one
// namespace: that of the oldest Gateway or Ingress listening there. The
// listeners of other namespaces for the same hostname, port and address
// are conflicted. Listeners of one hostname are merged into one host of
// the data path, served under the first one's certificate: without an
// owner, an Ingress of one namespace would be merged into another
// namespace's Gateway listener and served under its certificate, whatever
// the Gateway allows. A more precise hostname (a.example.com beside
// *.example.com) is another hostname: requests for it go to its listener,
// as the Gateway API has it.
func (c *compiler) claimHostnames(all []*listener) {
	type hostKey struct {
		servedPort
		hostname string
	}
	owner := map[hostKey]*listener{}
	for _, l := range byAge(all) {
		if !l.accepted || l.conflicted != "" {
			continue
		}
		keys := []hostKey{}
		var taken *listener
		for _, pk := range c.portsOf(l) {
			k := hostKey{pk, l.hostname}
			keys = append(keys, k)
			if o := owner[k]; o != nil && o.gw.Namespace != l.gw.Namespace && taken == nil {
				taken = o
			}
		}
		if taken != nil {
			host := l.hostname
			if host == "" {
				host = "any hostname"
			}
			l.conflicted = string(gatewayv1.ListenerReasonHostnameConflict)
			l.conflictMsg = fmt.Sprintf("%s on port %d belongs to namespace %s (%s listened first): a hostname on a port is served for one namespace; choose another hostname or port",
				host, l.spec.Port, taken.gw.Namespace, ownerOf(taken))
			continue
		}
		for _, k := range keys {
			if owner[k] == nil {
				owner[k] = l
			}
		}
	}
}

// byAge orders listeners by the age of their Gateway or Ingress, oldest
// first, keeping the order of one object's listeners.
func byAge(all []*listener) []*listener {
	out := slices.Clone(all)
	slices.SortStableFunc(out, func(a, b *listener) int { return olderFirst(a.gw, b.gw) })
	return out
}

// ingressGatewayPrefix starts the name of the Gateway that stands for an
// Ingress's listeners; no Gateway's name can have it.
const ingressGatewayPrefix = "ingress:"

// ownerOf names the object l is a listener of.
func ownerOf(l *listener) string {
	if name, ok := strings.CutPrefix(l.gw.Name, ingressGatewayPrefix); ok {
		return "Ingress " + l.gw.Namespace + "/" + name
	}
	return "Gateway " + l.gw.Namespace + "/" + l.gw.Name
}

// portInUse weighs the nodes' reports of l's port in use there. A node's
// report concerns that node only: the listener stays served by the others
// and its status names the node. Only when every node that would serve it
// says so is the listener not accepted.
func (c *compiler) portInUse(l *listener) {
	busy := c.unavailable[l.spec.Port]
	if len(busy) == 0 || !l.accepted {
		return
	}
	serving := c.servingNodes(l)
	var unserved []string
	for _, n := range serving {
		if slices.Contains(busy, n) {
			unserved = append(unserved, n)
		}
	}
	switch {
	case len(unserved) == 0:
	case len(unserved) == len(serving):
		l.accepted = false
		l.acceptedReason = string(gatewayv1.ListenerReasonPortUnavailable)
		l.acceptedMsg = fmt.Sprintf("port %d is in use on node %s: free it there or choose another port", l.spec.Port, strings.Join(unserved, ", "))
	default:
		l.unserved = unserved
	}
}

// servingNodes are the nodes that serve l: those that hold its Gateway's
// own addresses, or every node.
func (c *compiler) servingNodes(l *listener) []string {
	var out []string
	if a := c.addressing[nameOf(l.gw)]; a != nil && len(a.addrs) > 0 {
		for _, ip := range a.addrs {
			if n := c.held[ip]; n != "" && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
		return out
	}
	for _, n := range c.in.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// freeFor are the nodes on which no port of ls is in use: the ones to
// hold the addresses of their Gateway, if any may.
func (c *compiler) freeFor(ls []*listener) []*corev1.Node {
	return slices.DeleteFunc(slices.Clone(c.in.Nodes), func(n *corev1.Node) bool {
		return slices.ContainsFunc(ls, func(l *listener) bool { return slices.Contains(c.unavailable[l.spec.Port], n.Name) })
	})
}

// maxConfigBytes bounds the published Config: a Secret holds at most
// 1 MiB, and a Config that does not fit would stop every update.
const maxConfigBytes = 900 << 10

const fullMsg = "the cluster's Gateway configuration is full (900 KiB, published in a Secret of at most 1 MiB) and this listener is among the newest: remove listeners, routes or certificates you no longer need"

// fit keeps the published Config under maxConfigBytes: the listeners of
// the oldest Gateways and Ingresses first, each certificate counted once;
// a listener that does not fit is not programmed and says why, while the
// others are served.
func (c *compiler) fit(all []*listener) {
	certs := map[string]bool{}
	size := 0
	for _, l := range byAge(all) {
		if !l.programmed {
			continue
		}
		n := 0
		if l.cert != nil && !certs[l.certID] {
			// Base64 in JSON.
			n += (len(l.cert.Cert) + len(l.cert.Key)) * 4 / 3
		}
		routes, _ := json.Marshal(l.routes)
		n += len(routes) * len(c.portsOf(l))
		if size+n > maxConfigBytes {
			l.programmed, l.full = false, true
			continue
		}
		size += n
		if l.cert != nil {
			certs[l.certID] = true
		}
	}
}

// ingressStatus is the status of an Ingress of the class kelp: the
// addresses it is served on and, on each, the ports where a host of it is
// not served, with the reason (status.loadBalancer.ingress[].ports[].error,
// the one place an Ingress's status has for it).
func (c *compiler) ingressStatus(ing *networkingv1.Ingress, ls []*listener) []networkingv1.IngressLoadBalancerIngress {
	name := types.NamespacedName{Namespace: ing.Namespace, Name: ingressGatewayPrefix + ing.Name}
	var ports []networkingv1.IngressPortStatus
	for _, l := range ls {
		if nameOf(l.gw) != name || l.programmed || slices.ContainsFunc(ports, func(p networkingv1.IngressPortStatus) bool { return p.Port == l.spec.Port }) {
			continue
		}
		ports = append(ports, networkingv1.IngressPortStatus{Port: l.spec.Port, Protocol: corev1.ProtocolTCP, Error: ptr(AnnotationPrefix + whyNotServed(l))})
	}
	slices.SortFunc(ports, func(a, b networkingv1.IngressPortStatus) int { return int(a.Port - b.Port) })
	var out []networkingv1.IngressLoadBalancerIngress
	for _, a := range c.addresses() {
		out = append(out, networkingv1.IngressLoadBalancerIngress{IP: a.Value, Ports: ports})
	}
	return out
}

// whyNotServed is the reason a listener that is not programmed is not, in
// CamelCase as its conditions have it.
func whyNotServed(l *listener) string {
	switch {
	case l.conflicted != "":
		return l.conflicted
	case !l.accepted:
		return l.acceptedReason
	case !l.resolved:
		return l.resolvedReason
	case l.full:
		return "ConfigurationFull"
	}
	return string(gatewayv1.ListenerReasonPending)
}
