package netpol

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/google/nftables"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/informer"
	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/reconcile"
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
//
// informers are the node's cache; TrimPod says what of a Pod it reads.
func Run(ctx context.Context, informers *informer.Cache, cfg Config) error {
	return run(ctx, informers, cfg, checkEvery)
}

func run(ctx context.Context, informers *informer.Cache, cfg Config, checkEvery time.Duration) error {
	conn, err := nft.New()
	if err != nil {
		return err
	}
	policies := informers.Networking().V1().NetworkPolicies()
	pods := informers.Core().V1().Pods()
	namespaces := informers.Core().V1().Namespaces()
	e := &enforcer{
		cfg: cfg, conn: conn, reapply: true,
		policies: policies.Lister(), pods: pods.Lister(), namespaces: namespaces.Lister(),
	}
	return reconcile.Loop{
		Informers: map[string]cache.SharedIndexInformer{
			"networkpolicies": policies.Informer(),
			"pods":            pods.Informer(),
			"namespaces":      namespaces.Informer(),
		},
		Start:    informers.Start,
		Coalesce: coalesce,
		Resync:   checkEvery,
		Sync:     e.sync,
	}.Run(ctx)
}

// enforcer is the state of Run between syncs.
type enforcer struct {
	cfg        Config
	conn       *nftables.Conn
	policies   networkinglisters.NetworkPolicyLister
	pods       corelisters.PodLister
	namespaces corelisters.NamespaceLister
	applied    Ruleset
	// reapply says the table must be programmed even if applied is what
	// the policies want: at start, and once someone else changed it.
	reapply bool
	// enforcing says the table was programmed once (and the legacy table
	// removed).
	enforcing bool
}

// sync programs the rules the policies want for this node's pods if they
// changed; on the resync tick it only checks that the table is as it made
// it, and programs it again if not.
func (e *enforcer) sync(_ context.Context, resync bool) error {
	if resync {
		switch ok, err := intact(e.conn, e.applied); {
		case err != nil:
			log.WithError(err).Warn("could not check the network policy table; programming it again")
		case !ok:
			log.Warn("the network policy table was changed behind kelp's back; programming it again")
		default:
			return nil
		}
		e.reapply = true
	}
	pols, err := e.policies.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list network policies: %w", err)
	}
	ps, err := e.pods.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	nss, err := e.namespaces.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	r := Compile(pols, ps, nss, e.cfg.NodeName)
	if !e.reapply && reflect.DeepEqual(r, e.applied) {
		return nil
	}
	started := time.Now()
	// The first programming also drops the table of a kelp before
	// dual-stack, in the same batch.
	if err := apply(e.conn, r, !e.enforcing); err != nil {
		return err
	}
	e.applied, e.reapply = r, false
	log.WithFields(logrus.Fields{"ingress-chains": len(r.Ingress), "egress-chains": len(r.Egress),
		"took": time.Since(started).Round(time.Microsecond)}).Debug("programmed network policies")
	if !e.enforcing {
		e.enforcing = true
		log.Info("network policy enforcement started")
	}
	return nil
}

// TrimPod keeps of a pod only what Compile reads: every node caches every
// pod of the cluster, so the rest would cost memory on each of them.
func TrimPod(obj any) (any, error) {
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
