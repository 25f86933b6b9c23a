package proxy

import (
	"cmp"
	"context"
	"errors"
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
	// ClusterCIDRs are the pod networks, at most one per IP family: the
	// proxy serves the Services' addresses of these families (a table
	// each), and masquerades traffic from outside them.
	ClusterCIDRs []netip.Prefix
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

// Validate checks that cfg names a cluster CIDR of one family or two.
func (cfg Config) Validate() error {
	if len(cfg.ClusterCIDRs) == 0 {
		return errors.New("service proxy: no cluster CIDR; pass --cluster-cidr")
	}
	seen := map[*family]netip.Prefix{}
	for _, p := range cfg.ClusterCIDRs {
		if !p.IsValid() {
			return fmt.Errorf("service proxy: invalid cluster CIDR %s", p)
		}
		f := familyOf(p.Addr())
		if other, ok := seen[f]; ok {
			return fmt.Errorf("service proxy: cluster CIDRs %s and %s are of the same IP family; give one IPv4 and one IPv6 CIDR at most", other, p)
		}
		seen[f] = p
	}
	return nil
}

func run(ctx context.Context, client kubernetes.Interface, cfg Config, tamperCheck time.Duration) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	conn, err := nft.New()
	if err != nil {
		return err
	}
	// Under the proxy's identity (system:kube-proxy), which may list
	// Services: not the node's cache, whose controller identity may not.
	factory := informers.NewSharedInformerFactory(client, 0)
	services := factory.Core().V1().Services()
	endpointSlices := factory.Discovery().V1().EndpointSlices()
	// This node's pods alone, under the kubelet's identity.
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
	// applied is what the proxy last programmed: the tables hold it if
	// inStep, and have chains chains then. Not in step (at start, once
	// someone else changed a table, after a failed programming), the
	// tables are replaced whole; in step, only what changed is.
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
		if n := countChains(p.conn, p.cfg.ClusterCIDRs); n >= 0 && n == p.chains {
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
		added, err := update(p.conn, p.cfg.ClusterCIDRs, p.applied, ports)
		if err != nil {
			log.WithError(err).Warnf("could not update nftables table %s; replacing it", Table)
			p.inStep = false
		} else {
			p.chains += added
		}
	}
	if !p.inStep {
		how = "replaced"
		if err := Apply(p.conn, p.cfg.ClusterCIDRs, ports); err != nil {
			return err
		}
		p.chains = countChains(p.conn, p.cfg.ClusterCIDRs)
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

// countChains counts the chains of the proxy's tables for the families of
// clusterCIDRs: -1 if one of them is missing (a table always has chains).
func countChains(c *nftables.Conn, clusterCIDRs []netip.Prefix) int {
	chains, err := c.ListChains()
	if err != nil {
		return -1
	}
	perFamily := map[nftables.TableFamily]int{}
	for _, ch := range chains {
		if ch.Table.Name == Table {
			perFamily[ch.Table.Family]++
		}
	}
	n := 0
	for _, f := range families {
		if _, ok := cidrOf(clusterCIDRs, f); ok {
			if perFamily[f.table] == 0 {
				return -1
			}
			n += perFamily[f.table]
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
// endpoint slices, in a stable order: every port of every ClusterIP (one
// per IP family of a dual-stack Service) other than skip, with the
// endpoints, external addresses and load balancer addresses of the
// ClusterIP's family.
func Ports(svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice, node string, skip netip.Addr) []Port {
	bySvc := slicesByService(eps)
	var out []Port
	for _, svc := range svcs {
		if svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		ips := svc.Spec.ClusterIPs
		if len(ips) == 0 {
			ips = []string{svc.Spec.ClusterIP} // see clusterIPs
		}
		for _, s := range ips {
			ip, err := netip.ParseAddr(s)
			if ip = ip.Unmap(); err != nil || ip == skip {
				continue // headless, or the cluster DNS address
			}
			svcSlices := bySvc[svc.Namespace+"/"+svc.Name]
			external := externalIPs(svc, ip.Is6())
			for _, sp := range svc.Spec.Ports {
				proto, ok := protocols[sp.Protocol]
				if !ok {
					continue
				}
				p := Port{ClusterIP: ip, Protocol: proto, Port: uint16(sp.Port), ExternalIPs: external}
				if svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
					p.NodePort = uint16(sp.NodePort)
				}
				all := endpointsOf(svcSlices, addressType(ip), sp, node)
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
	}
	slices.SortFunc(out, func(a, b Port) int {
		return cmp.Or(a.ClusterIP.Compare(b.ClusterIP), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
	})
	return out
}

// clusterIPs are the addresses of a Service, one per IP family: none for a
// headless one.
func clusterIPs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		// The API fills clusterIPs in; objects made by hand may not.
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		if ip, err := netip.ParseAddr(s); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// addressType is the type of the endpoint slices that serve ip.
func addressType(ip netip.Addr) discoveryv1.AddressType {
	if ip.Is6() {
		return discoveryv1.AddressTypeIPv6
	}
	return discoveryv1.AddressTypeIPv4
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

// HostPorts returns the hostPorts of running pods, in a stable order: on
// every address of the node, or on their hostIP, for each address of the
// pod (one per IP family) that can be reached there.
func HostPorts(pods []*corev1.Pod) []Port {
	var out []Port
	for _, pod := range pods {
		if pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
			continue
		}
		for _, ip := range podIPs(pod) {
			for _, c := range pod.Spec.Containers {
				for _, cp := range c.Ports {
					proto, ok := protocols[cp.Protocol]
					if cp.HostPort == 0 || !ok {
						continue
					}
					p := Port{Protocol: proto, Endpoints: []netip.AddrPort{netip.AddrPortFrom(ip, uint16(cp.ContainerPort))}}
					// A hostIP binds the port to that one address of the
					// node, or with 0.0.0.0 or :: to every address of its
					// family (as the CNI portmap plugin does); the pod's
					// address of the other family has none.
					hostIP, err := netip.ParseAddr(cp.HostIP)
					hostIP = hostIP.Unmap()
					switch {
					case err != nil:
						p.NodePort = uint16(cp.HostPort)
					case hostIP.Is6() != ip.Is6():
						continue
					case hostIP.IsUnspecified():
						p.NodePort = uint16(cp.HostPort)
					default:
						p.Port, p.ExternalIPs = uint16(cp.HostPort), []netip.Addr{hostIP}
					}
					out = append(out, p)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Port) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.NodePort, b.NodePort), cmp.Compare(a.Port, b.Port), a.Endpoints[0].Compare(b.Endpoints[0]))
	})
	return out
}

// podIPs are the addresses of a pod, one per IP family.
func podIPs(pod *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, s := range pod.Status.PodIPs {
		if ip, err := netip.ParseAddr(s.IP); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	if len(out) == 0 {
		// The kubelet fills podIPs in; objects made by hand may not.
		if ip, err := netip.ParseAddr(pod.Status.PodIP); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// externalIPs are the Service's externalIPs and load balancer ingress IPs
// of one IP family: traffic to them goes to the endpoints of that family.
func externalIPs(svc *corev1.Service, v6 bool) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if ip, err := netip.ParseAddr(s); err == nil && ip.Unmap().Is6() == v6 {
			out = append(out, ip.Unmap())
		}
	}
	for _, s := range svc.Spec.ExternalIPs {
		add(s)
	}
	for _, in := range svc.Status.LoadBalancer.Ingress {
		add(in.IP)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
