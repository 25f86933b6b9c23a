// Package servicelb is kelp's built-in load balancer for Services of type
// LoadBalancer: it gives each one the addresses of the cluster's nodes of
// the Service's IP families as ingress IPs, and the nodes' Service proxies
// answer on them.
package servicelb

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kelp-dev/kelp/internal/informer"
	"github.com/kelp-dev/kelp/internal/reconcile"
)

// EnableLabel set to "true" on some nodes limits load balancer addresses to
// those nodes.
const EnableLabel = "svccontroller.kelp.io/enablelb"

var log = logrus.WithField("component", "servicelb")

// Run keeps the load balancer status of every LoadBalancer Service without
// a loadBalancerClass until ctx ends.
func Run(ctx context.Context, client kubernetes.Interface, informers *informer.Cache) error {
	services := informers.Core().V1().Services()
	nodes := informers.Core().V1().Nodes()
	sync := func(ctx context.Context, _ bool) error {
		allNodes, err := nodes.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		svcs, err := services.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		byFamilies := map[string][]corev1.LoadBalancerIngress{}
		for _, svc := range svcs {
			if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.LoadBalancerClass != nil {
				continue
			}
			families := Families(svc)
			k := fmt.Sprint(families)
			ingress, ok := byFamilies[k]
			if !ok {
				ingress = Ingress(allNodes, families)
				byFamilies[k] = ingress
			}
			if reflect.DeepEqual(svc.Status.LoadBalancer.Ingress, ingress) {
				continue
			}
			updated := svc.DeepCopy()
			updated.Status.LoadBalancer.Ingress = ingress
			if _, err := client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
				// A conflict brings an update event, and another round.
				log.WithError(err).WithField("service", svc.Namespace+"/"+svc.Name).Debug("update load balancer status")
			}
		}
		return nil
	}
	return reconcile.Loop{
		Informers: map[string]cache.SharedIndexInformer{"services": services.Informer(), "nodes": nodes.Informer()},
		Start:     informers.Start,
		Sync:      sync,
	}.Run(ctx)
}

// Ingress returns the load balancer ingress of a Service of families (see
// Families): the internal IPs of those families of the Ready nodes, of
// only those labelled EnableLabel=true if any is; the first family's
// first, each family's in order.
func Ingress(nodes []*corev1.Node, families []corev1.IPFamily) []corev1.LoadBalancerIngress {
	labelled := slices.ContainsFunc(nodes, func(n *corev1.Node) bool { return n.Labels[EnableLabel] == "true" })
	byFamily := map[corev1.IPFamily][]netip.Addr{}
	for _, n := range nodes {
		if (labelled && n.Labels[EnableLabel] != "true") || !ready(n) {
			continue
		}
		for _, a := range n.Status.Addresses {
			ip, err := netip.ParseAddr(a.Address)
			if a.Type != corev1.NodeInternalIP || err != nil {
				continue
			}
			ip = ip.Unmap()
			family := corev1.IPv4Protocol
			if ip.Is6() {
				family = corev1.IPv6Protocol
			}
			byFamily[family] = append(byFamily[family], ip)
		}
	}
	var out []corev1.LoadBalancerIngress
	for _, family := range slices.Compact(slices.Clone(families)) {
		ips := byFamily[family]
		slices.SortFunc(ips, netip.Addr.Compare)
		for _, ip := range slices.Compact(ips) {
			out = append(out, corev1.LoadBalancerIngress{IP: ip.String(), IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
		}
	}
	return out
}

// Families are the IP families of a Service, its primary first: as the
// API sets them (spec.ipFamilies), else those of its ClusterIPs, else
// IPv4.
func Families(svc *corev1.Service) []corev1.IPFamily {
	if len(svc.Spec.IPFamilies) > 0 {
		return svc.Spec.IPFamilies
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []corev1.IPFamily
	for _, s := range ips {
		if ip, err := netip.ParseAddr(s); err == nil {
			if ip.Unmap().Is6() {
				out = append(out, corev1.IPv6Protocol)
			} else {
				out = append(out, corev1.IPv4Protocol)
			}
		}
	}
	if len(out) == 0 {
		return []corev1.IPFamily{corev1.IPv4Protocol}
	}
	return out
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
