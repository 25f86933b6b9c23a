package proxy

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// coalesce is how long the proxy waits after a change for more before it
// programs the kernel: a rollout changes many EndpointSlices at once.
const coalesce = 100 * time.Millisecond

var log = logrus.WithField("component", "proxy")

// Config is what the proxy needs to know of the cluster.
type Config struct {
	ClusterCIDR netip.Prefix
	// ClusterDNS is served on every node itself (see package dns); the
	// proxy leaves its address alone.
	ClusterDNS netip.Addr
	// NodeName and Pods (a client allowed to watch this node's pods, the
	// kubelet's) serve the hostPorts of the pods on this node.
	NodeName string
	Pods     kubernetes.Interface
}

// Run programs the Services of the cluster until ctx ends: once all of
// them at start, then again after every change.
func Run(ctx context.Context, client kubernetes.Interface, cfg Config) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	services := factory.Core().V1().Services()
	endpointSlices := factory.Discovery().V1().EndpointSlices()
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	if _, err := services.Informer().AddEventHandler(handler); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	if _, err := endpointSlices.Informer().AddEventHandler(handler); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	podFactory := informers.NewSharedInformerFactoryWithOptions(cfg.Pods, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	}))
	pods := podFactory.Core().V1().Pods()
	if _, err := pods.Informer().AddEventHandler(handler); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	for _, f := range []informers.SharedInformerFactory{factory, podFactory} {
		f.Start(ctx.Done())
		defer f.Shutdown()
		for typ, synced := range f.WaitForCacheSync(ctx.Done()) {
			if !synced {
				return fmt.Errorf("proxy: %v not synced: %w", typ, ctx.Err())
			}
		}
	}
	var applied []Port
	for {
		svcs, err := services.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		eps, err := endpointSlices.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		nodePods, err := pods.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		ports := append(Ports(svcs, eps, cfg.ClusterDNS), HostPorts(nodePods)...)
		if applied == nil || !reflect.DeepEqual(ports, applied) {
			started := time.Now()
			if err := Apply(conn, cfg.ClusterCIDR, ports); err != nil {
				return err
			}
			if err := forget(staleUDPFlows(applied, ports)); err != nil {
				log.WithError(err).Warn("could not forget UDP flows to removed endpoints")
			}
			applied = ports
			log.WithFields(logrus.Fields{"ports": len(ports), "took": time.Since(started).Round(time.Microsecond)}).Debug("programmed Services")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(coalesce):
		}
	}
}

var protocols = map[corev1.Protocol]uint8{
	corev1.ProtocolTCP:  unix.IPPROTO_TCP,
	corev1.ProtocolUDP:  unix.IPPROTO_UDP,
	corev1.ProtocolSCTP: unix.IPPROTO_SCTP,
}

// Ports returns what the proxy programs for svcs and their endpoint
// slices, in a stable order: every port of every Service with an IPv4
// ClusterIP other than skip, with the addresses of its ready endpoints.
func Ports(svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice, skip netip.Addr) []Port {
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range eps {
		if s.AddressType == discoveryv1.AddressTypeIPv4 {
			key := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
			bySvc[key] = append(bySvc[key], s)
		}
	}
	var out []Port
	for _, svc := range svcs {
		ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
		if err != nil || !ip.Is4() || ip == skip || svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue // headless, IPv6 or a DNS name: nothing to proxy
		}
		for _, sp := range svc.Spec.Ports {
			proto, ok := protocols[sp.Protocol]
			if !ok {
				continue
			}
			p := Port{ClusterIP: ip, Protocol: proto, Port: uint16(sp.Port)}
			if svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
				p.NodePort = uint16(sp.NodePort)
			}
			p.ExternalIPs = externalIPs(svc)
			p.Endpoints = readyEndpoints(bySvc[svc.Namespace+"/"+svc.Name], sp)
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Port) int {
		return cmp.Or(a.ClusterIP.Compare(b.ClusterIP), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	})
	return out
}

// HostPorts returns the hostPorts of running pods, on every address of
// the node (a hostIP is not honoured yet), in a stable order.
func HostPorts(pods []*corev1.Pod) []Port {
	var out []Port
	for _, pod := range pods {
		ip, err := netip.ParseAddr(pod.Status.PodIP)
		if err != nil || !ip.Is4() || pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
			continue
		}
		for _, c := range pod.Spec.Containers {
			for _, cp := range c.Ports {
				proto, ok := protocols[cp.Protocol]
				if cp.HostPort == 0 || !ok {
					continue
				}
				out = append(out, Port{Protocol: proto, NodePort: uint16(cp.HostPort),
					Endpoints: []netip.AddrPort{netip.AddrPortFrom(ip, uint16(cp.ContainerPort))}})
			}
		}
	}
	slices.SortFunc(out, func(a, b Port) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.NodePort, b.NodePort), a.Endpoints[0].Compare(b.Endpoints[0]))
	})
	return out
}

// externalIPs are the Service's externalIPs and load balancer ingress IPs.
func externalIPs(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, s := range svc.Spec.ExternalIPs {
		if ip, err := netip.ParseAddr(s); err == nil {
			out = append(out, ip)
		}
	}
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if ip, err := netip.ParseAddr(in.IP); err == nil {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// readyEndpoints are the addresses serving sp: endpoints the slices call
// ready (no condition means ready), on the slice port of the same name.
func readyEndpoints(eps []*discoveryv1.EndpointSlice, sp corev1.ServicePort) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range eps {
		var target int32
		for _, p := range s.Ports {
			if p.Name != nil && *p.Name == sp.Name && p.Port != nil && (p.Protocol == nil || *p.Protocol == sp.Protocol) {
				target = *p.Port
			}
		}
		if target == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil {
					out = append(out, netip.AddrPortFrom(ip, uint16(target)))
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(out)
}
