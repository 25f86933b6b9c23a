package netpol

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/notify"
)

const (
	// coalesce is how long Run waits after a change for more before it
	// programs the kernel: a rollout changes many pods at once.
	coalesce = 100 * time.Millisecond
	// checkEvery is how often Run looks whether someone changed or
	// deleted its table.
	checkEvery = 10 * time.Second
)

var log = logrus.WithField("component", "netpol")

// Config is what enforcement needs to know of the cluster.
type Config struct {
	// NodeName is the node whose pods are enforced.
	NodeName string
}

// Run enforces the NetworkPolicies of the cluster for the pods of this
// node until ctx ends: at start, after every change of a policy, pod or
// namespace, and again whenever the table was changed behind its back.
// On return it leaves the table in place, as the proxy does: pods outlive
// kelp, and their policies must too (`kelp killall` removes it).
func Run(ctx context.Context, client kubernetes.Interface, cfg Config) error {
	return run(ctx, client, cfg, checkEvery)
}

func run(ctx context.Context, client kubernetes.Interface, cfg Config, checkEvery time.Duration) error {
	conn, err := nft.New()
	if err != nil {
		return fmt.Errorf("netpol: %w", err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(trimPod))
	policies := factory.Networking().V1().NetworkPolicies()
	pods := factory.Core().V1().Pods()
	namespaces := factory.Core().V1().Namespaces()
	changed := notify.New()
	handler := changed.Handler()
	for _, informer := range []cache.SharedIndexInformer{policies.Informer(), pods.Informer(), namespaces.Informer()} {
		if _, err := informer.AddEventHandler(handler); err != nil {
			return fmt.Errorf("netpol: %w", err)
		}
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, synced := range factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			return fmt.Errorf("netpol: %v not synced: %w", typ, ctx.Err())
		}
	}
	check := time.NewTicker(checkEvery)
	defer check.Stop()
	var applied Ruleset
	for first, reapply := true, true; ; first = false {
		pols, err := policies.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("netpol: %w", err)
		}
		ps, err := pods.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("netpol: %w", err)
		}
		nss, err := namespaces.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("netpol: %w", err)
		}
		r := Compile(pols, ps, nss, cfg.NodeName)
		if reapply || !reflect.DeepEqual(r, applied) {
			started := time.Now()
			if err := Apply(conn, r); err != nil {
				return err
			}
			applied, reapply = r, false
			log.WithFields(logrus.Fields{"ingress-chains": len(r.Ingress), "egress-chains": len(r.Egress),
				"took": time.Since(started).Round(time.Microsecond)}).Debug("programmed network policies")
			if first {
				log.Info("network policy enforcement started")
			}
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-changed.C():
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(coalesce):
				}
				break wait
			case <-check.C:
				switch ok, err := intact(conn, applied); {
				case err != nil:
					log.WithError(err).Warn("could not check the network policy table; programming it again")
				case !ok:
					log.Warn("the network policy table was changed behind kelp's back; programming it again")
				default:
					continue
				}
				reapply = true
				break wait
			}
		}
	}
}

// trimPod keeps of a pod only what Compile reads: every node caches every
// pod of the cluster, so the rest would cost memory on each of them.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	containers := make([]corev1.Container, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		containers[i] = corev1.Container{Name: c.Name, Ports: c.Ports}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion,
			Labels: pod.Labels, CreationTimestamp: pod.CreationTimestamp, DeletionTimestamp: pod.DeletionTimestamp,
		},
		Spec:   corev1.PodSpec{NodeName: pod.Spec.NodeName, HostNetwork: pod.Spec.HostNetwork, Containers: containers},
		Status: corev1.PodStatus{Phase: pod.Status.Phase, PodIP: pod.Status.PodIP, PodIPs: pod.Status.PodIPs},
	}, nil
}
