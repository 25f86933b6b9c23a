package proxy

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// endpoint is one address behind a Service port, with what the proxy
// needs to know of it.
type endpoint struct {
	addr  netip.AddrPort
	local bool // on this node
	ready bool
	// servingTerminating: the pod is shutting down but still answers. Such
	// endpoints are used only when no ready one is left, so a rollout or a
	// drain does not drop connections (as kube-proxy does).
	servingTerminating bool
}

// slicesByService groups the endpoint slices of addresses (IPv4 and IPv6,
// not FQDN) by "namespace/service".
func slicesByService(eps []*discoveryv1.EndpointSlice) map[string][]*discoveryv1.EndpointSlice {
	by := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range eps {
		if s.AddressType == discoveryv1.AddressTypeIPv4 || s.AddressType == discoveryv1.AddressTypeIPv6 {
			key := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
			by[key] = append(by[key], s)
		}
	}
	return by
}

// endpointsOf lists the endpoints of sp in its slices of addresses of
// type at: those on the slice port of the same name and protocol.
func endpointsOf(slices []*discoveryv1.EndpointSlice, at discoveryv1.AddressType, sp corev1.ServicePort, node string) []endpoint {
	var out []endpoint
	for _, s := range slices {
		if s.AddressType != at {
			continue
		}
		var target int32
		for _, p := range s.Ports {
			if ptr.Deref(p.Name, "") == sp.Name && p.Port != nil && ptr.Deref(p.Protocol, corev1.ProtocolTCP) == sp.Protocol {
				target = *p.Port
			}
		}
		if target == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			// An unset condition means ready; serving defaults to ready.
			ready := ptr.Deref(e.Conditions.Ready, true)
			serving := ptr.Deref(e.Conditions.Serving, ready)
			terminating := ptr.Deref(e.Conditions.Terminating, false)
			for _, a := range e.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil {
					out = append(out, endpoint{
						addr:               netip.AddrPortFrom(ip.Unmap(), uint16(target)),
						local:              node != "" && ptr.Deref(e.NodeName, "") == node,
						ready:              ready,
						servingTerminating: serving && terminating,
					})
				}
			}
		}
	}
	return out
}

// usable picks the addresses traffic goes to, of all or only of the local
// endpoints: the ready ones, or if there are none, those still serving
// while they terminate.
func usable(all []endpoint, localOnly bool) []netip.AddrPort {
	var ready, terminating []netip.AddrPort
	for _, e := range all {
		switch {
		case localOnly && !e.local:
		case e.ready:
			ready = append(ready, e.addr)
		case e.servingTerminating:
			terminating = append(terminating, e.addr)
		}
	}
	out := ready
	if len(out) == 0 {
		out = terminating
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}
