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
	"k8s.io/utils/ptr"

	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/notify"
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
	conn, err := nft.New()
	if err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	services := factory.Core().V1().Services()
	endpointSlices := factory.Discovery().V1().EndpointSlices()
	changed := notify.New()
	handler := changed.Handler()
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
	health := newHealthServer()
	defer health.close()
	check := time.NewTicker(tamperCheck)
	defer check.Stop()
	var applied []Port
	var chains int // in the table as applied
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
		ports := append(Ports(svcs, eps, cfg.NodeName, cfg.ClusterDNS), HostPorts(nodePods)...)
		if applied == nil || !reflect.DeepEqual(ports, applied) {
			started := time.Now()
			if err := Apply(conn, cfg.ClusterCIDR, ports); err != nil {
				return err
			}
			if err := forget(staleUDPFlows(applied, ports)); err != nil {
				log.WithError(err).Warn("could not forget UDP flows to removed endpoints")
			}
			applied = ports
			chains = countChains(conn)
			log.WithFields(logrus.Fields{"ports": len(ports), "took": time.Since(started).Round(time.Microsecond)}).Debug("programmed Services")
		}
		if err := health.update(HealthChecks(svcs, eps, cfg.NodeName)); err != nil {
			log.WithError(err).Warn("could not serve a health check port")
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-changed.C():
				break wait
			case <-check.C:
				// Someone flushed the ruleset (a firewall reload, say):
				// program everything again.
				if countChains(conn) != chains {
					log.Warnf("nftables table %s was changed by someone else; programming it again", Table)
					applied = nil
					break wait
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(coalesce):
		}
	}
}

// tamperCheck is how often the proxy checks that its table is still as it
// made it.
const tamperCheck = 10 * time.Second

// countChains counts the chains of the proxy's table: -1 if there is no
// such table.
func countChains(c *nftables.Conn) int {
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return -1
	}
	n := -1
	for _, ch := range chains {
		if ch.Table.Name == Table {
			n = max(n, 0) + 1
		}
	}
	return n
}

var protocols = map[corev1.Protocol]uint8{
	corev1.ProtocolTCP:  unix.IPPROTO_TCP,
	corev1.ProtocolUDP:  unix.IPPROTO_UDP,
	corev1.ProtocolSCTP: unix.IPPROTO_SCTP,
}

// Ports returns what the proxy of node programs for svcs and their
// endpoint slices, in a stable order: every port of every Service with an
// IPv4 ClusterIP other than skip.
func Ports(svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice, node string, skip netip.Addr) []Port {
	bySvc := slicesByService(eps)
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
			all := endpointsOf(bySvc[svc.Namespace+"/"+svc.Name], sp, node)
			p.Endpoints = usable(all, ptr.Deref(svc.Spec.InternalTrafficPolicy, corev1.ServiceInternalTrafficPolicyCluster) == corev1.ServiceInternalTrafficPolicyLocal)
			if externalLocal(svc) {
				p.ExternalLocal = true
				p.LocalEndpoints = usable(all, true)
			}
			if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
				p.Affinity = affinityTimeout(svc)
			}
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Port) int {
		return cmp.Or(a.ClusterIP.Compare(b.ClusterIP), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	})
	return out
}

// externalLocal says whether traffic from outside the cluster stays on the
// node it arrives at (externalTrafficPolicy Local); only Services that
// take such traffic have the policy.
func externalLocal(svc *corev1.Service) bool {
	external := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer || len(svc.Spec.ExternalIPs) > 0
	return external && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
}

// affinityTimeout is how long a client sticks to its endpoint; the API
// defaults it to 3 hours.
func affinityTimeout(svc *corev1.Service) time.Duration {
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		return time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
	}
	return time.Duration(corev1.DefaultClientIPServiceAffinitySeconds) * time.Second
}

// HostPorts returns the hostPorts of running pods, on every address of
// the node or on their hostIP, in a stable order.
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
				p := Port{Protocol: proto, Endpoints: []netip.AddrPort{netip.AddrPortFrom(ip, uint16(cp.ContainerPort))}}
				// A hostIP binds the port to that one address of the node.
				if hostIP, err := netip.ParseAddr(cp.HostIP); err == nil && hostIP.Is4() && !hostIP.IsUnspecified() {
					p.Port, p.ExternalIPs = uint16(cp.HostPort), []netip.Addr{hostIP}
				} else {
					p.NodePort = uint16(cp.HostPort)
				}
				out = append(out, p)
			}
		}
	}
	slices.SortFunc(out, func(a, b Port) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.NodePort, b.NodePort), cmp.Compare(a.Port, b.Port), a.Endpoints[0].Compare(b.Endpoints[0]))
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
