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
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/reconcile"
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
	return run(ctx, client, cfg, tamperCheck)
}

func run(ctx context.Context, client kubernetes.Interface, cfg Config, tamperCheck time.Duration) error {
	conn, err := nft.New()
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	services := factory.Core().V1().Services()
	endpointSlices := factory.Discovery().V1().EndpointSlices()
	podFactory := informers.NewSharedInformerFactoryWithOptions(cfg.Pods, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	}))
	pods := podFactory.Core().V1().Pods()
	p := &proxy{
		cfg: cfg, conn: conn, health: newHealthServer(),
		services: services.Lister(), endpointSlices: endpointSlices.Lister(), pods: pods.Lister(),
	}
	defer p.health.close()
	return reconcile.Loop{
		Informers: map[string]cache.SharedIndexInformer{
			"services":       services.Informer(),
			"endpointslices": endpointSlices.Informer(),
			"pods":           pods.Informer(),
		},
		Coalesce: coalesce,
		Resync:   tamperCheck,
		Sync:     p.sync,
	}.Run(ctx)
}

// proxy is the state of Run between syncs.
type proxy struct {
	cfg            Config
	conn           *nftables.Conn
	health         *healthServer
	services       corelisters.ServiceLister
	endpointSlices discoverylisters.EndpointSliceLister
	pods           corelisters.PodLister
	// applied is what the proxy last programmed: the table holds it if
	// inStep, and has chains chains then. Not in step (at start, once
	// someone else changed the table, after a failed programming), the
	// table is replaced whole; in step, only what changed is.
	applied []Port
	inStep  bool
	chains  int
}

// sync programs the ports of the Services and of this node's pods if they
// changed; on the resync tick it only checks that the table is as it made
// it, and programs it again if not.
func (p *proxy) sync(_ context.Context, resync bool) error {
	if resync && p.inStep {
		// No table (-1) is never as it made it, even if it was gone by
		// the time it counted its chains after programming.
		if n := countChains(p.conn); n >= 0 && n == p.chains {
			return nil
		}
		// Someone flushed the ruleset (a firewall reload, say).
		log.Warnf("nftables table %s was changed by someone else; programming it again", Table)
		p.inStep = false
	}
	svcs, err := p.services.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	eps, err := p.endpointSlices.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list endpoint slices: %w", err)
	}
	nodePods, err := p.pods.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	if err := p.program(append(Ports(svcs, eps, p.cfg.NodeName, p.cfg.ClusterDNS), HostPorts(nodePods)...)); err != nil {
		return err
	}
	if err := p.health.update(HealthChecks(svcs, eps, p.cfg.NodeName)); err != nil {
		log.WithError(err).Warn("could not serve a health check port")
	}
	return nil
}

// program makes the table hold ports. In step with it, it changes only
// the ports that changed (update); else, or if that fails, it replaces the
// whole table (Apply), so that no mistake of the table's or of update's
// outlives a sync.
func (p *proxy) program(ports []Port) error {
	if p.inStep && reflect.DeepEqual(ports, p.applied) {
		return nil
	}
	started := time.Now()
	how := "updated"
	if p.inStep {
		added, err := update(p.conn, p.cfg.ClusterCIDR, p.applied, ports)
		if err != nil {
			log.WithError(err).Warnf("could not update nftables table %s; replacing it", Table)
			p.inStep = false
		} else {
			p.chains += added
		}
	}
	if !p.inStep {
		how = "replaced"
		if err := Apply(p.conn, p.cfg.ClusterCIDR, ports); err != nil {
			return err
		}
		p.chains = countChains(p.conn)
	}
	if err := forget(staleUDPFlows(p.applied, ports)); err != nil {
		log.WithError(err).Warn("could not forget UDP flows to removed endpoints")
	}
	p.applied, p.inStep = ports, true
	log.WithFields(logrus.Fields{"ports": len(ports), "table": how, "took": time.Since(started).Round(time.Microsecond)}).Debug("programmed Services")
	return nil
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
