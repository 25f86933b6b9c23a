// Package servicelb is kelp's built-in load balancer for Services of type
// LoadBalancer: it gives each one the addresses of the cluster's nodes as
// ingress IPs, and the nodes' Service proxies answer on them.
package servicelb

import (
	"context"
	"reflect"
	"slices"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kelp-dev/kelp/internal/reconcile"
)

// EnableLabel set to "true" on some nodes limits load balancer addresses to
// those nodes.
const EnableLabel = "svccontroller.kelp.io/enablelb"

var log = logrus.WithField("component", "servicelb")

// Run keeps the load balancer status of every LoadBalancer Service without
// a loadBalancerClass until ctx ends.
func Run(ctx context.Context, client kubernetes.Interface) error {
	factory := informers.NewSharedInformerFactory(client, 0)
	services := factory.Core().V1().Services()
	nodes := factory.Core().V1().Nodes()
	sync := func(ctx context.Context, _ bool) error {
		allNodes, err := nodes.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		svcs, err := services.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		ingress := Ingress(allNodes)
		for _, svc := range svcs {
			if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.LoadBalancerClass != nil || reflect.DeepEqual(svc.Status.LoadBalancer.Ingress, ingress) {
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
		Sync:      sync,
	}.Run(ctx)
}

// Ingress returns the load balancer ingress of every Service: the internal
// IPs of the Ready nodes, of only those labelled EnableLabel=true if any is.
func Ingress(nodes []*corev1.Node) []corev1.LoadBalancerIngress {
	labelled := slices.ContainsFunc(nodes, func(n *corev1.Node) bool { return n.Labels[EnableLabel] == "true" })
	var ips []string
	for _, n := range nodes {
		if (labelled && n.Labels[EnableLabel] != "true") || !ready(n) {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				ips = append(ips, a.Address)
			}
		}
	}
	slices.Sort(ips)
	var out []corev1.LoadBalancerIngress
	for _, ip := range slices.Compact(ips) {
		out = append(out, corev1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
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
