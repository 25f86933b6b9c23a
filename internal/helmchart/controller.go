package helmchart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/reconcile"
)

var log = logrus.WithField("component", "helm-controller")

const (
	// coalesce is how long the controller waits after a change for more.
	coalesce = 100 * time.Millisecond
	// workers is how many HelmCharts are worked on at once: a chart
	// whose hooks take minutes does not hold up all the others.
	workers = 2
	// A failure is retried after retryMin, doubling up to retryMax.
	retryMin = 5 * time.Second
	retryMax = 5 * time.Minute
	// crdPoll is how often Run looks for the HelmChart CRD until it is
	// there.
	crdPoll = 5 * time.Second
)

// Config is what the controller needs.
type Config struct {
	// Client, Kube and Dynamic are the admin's: a chart may hold
	// anything, and Helm installs it.
	Client  *rest.Config
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Kubeconfig is the admin's file too, from which Helm makes the
	// clients of each action anew (its getter reads a kubeconfig).
	Kubeconfig string
	// LeaderElection makes the servers that share a datastore take turns:
	// only the holder of a Lease works on HelmCharts.
	LeaderElection bool
	// AllowLocalRepos lets charts come from loopback and link-local
	// addresses, which are refused otherwise.
	AllowLocalRepos bool
}

// Run installs, upgrades and uninstalls the releases of HelmCharts until
// ctx ends. It waits for the HelmChart CRD first.
func Run(ctx context.Context, cfg Config) error {
	u, err := url.Parse(cfg.Client.Host)
	if err != nil {
		return fmt.Errorf("the apiserver's address %s: %w", cfg.Client.Host, err)
	}
	api, err := rest.HTTPClientFor(cfg.Client)
	if err != nil {
		return fmt.Errorf("client for %s: %w", u, err)
	}
	if err := waitForCRD(ctx, cfg.Kube.Discovery()); err != nil {
		return err
	}
	c := &controller{
		dynamic:  cfg.Dynamic,
		fetch:    fetcher{apiHost: u.Host, api: api, allowLocal: cfg.AllowLocalRepos},
		releases: releases{kubeconfig: cfg.Kubeconfig},
	}
	if !cfg.LeaderElection {
		return c.run(ctx)
	}
	return lead(ctx, cfg.Kube, c.run)
}

// waitForCRD returns once the apiserver serves HelmCharts: the CRD comes
// from a manifest that kelp applies beside the controller, or that the
// user removed.
func waitForCRD(ctx context.Context, dc discovery.DiscoveryInterface) error {
	logged := false
	err := wait.PollUntilContextCancel(ctx, crdPoll, true, func(context.Context) (bool, error) {
		list, err := dc.ServerResourcesForGroupVersion(Resource.GroupVersion().String())
		if err == nil && slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == Resource.Resource }) {
			return true, nil
		}
		if !logged {
			log.Info("waiting for the HelmChart CRD (from the manifest helm-controller.yaml) to install charts")
			logged = true
		}
		return false, nil
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

type controller struct {
	dynamic  dynamic.Interface
	fetch    fetcher
	releases releases

	// What follows belongs to the reconcile loop's goroutine.
	charts cache.Store
	// busy holds the HelmCharts a worker has, by namespace/name: one at a
	// time for each, at most workers in all.
	busy map[string]bool
	// failed holds back the work whose last try failed (by workKey): a
	// new spec or a deletion is new work, tried at once.
	failed  reconcile.Backoff[string]
	done    chan result
	workers sync.WaitGroup
}

// result is how a worker's try went.
type result struct {
	chart, key string
	err        error
}

// run works on HelmCharts until ctx ends.
func (c *controller) run(ctx context.Context) error {
	informer := dynamicinformer.NewFilteredDynamicInformer(c.dynamic, Resource, metav1.NamespaceAll, 0, cache.Indexers{}, nil).Informer()
	c.charts = informer.GetStore()
	c.busy = map[string]bool{}
	c.failed = reconcile.Backoff[string]{First: retryMin, Max: retryMax}
	// Never more results than workers: a worker never waits to hand one in.
	c.done = make(chan result, workers)
	// The loop's context, which the workers have, ends as it returns.
	defer c.workers.Wait()
	return reconcile.Loop{
		Informers: map[string]cache.SharedIndexInformer{"helmcharts": informer},
		Coalesce:  coalesce,
		// A failed try is due again after retryMin at the earliest, and a
		// worker that finishes leaves the next chart waiting: both are
		// seen on the tick.
		Resync: retryMin,
		Sync:   c.dispatch,
	}.Run(ctx)
}

// dispatch hands each HelmChart that has work to a worker, unless one has
// it already, all are busy, or its last try failed too recently.
func (c *controller) dispatch(ctx context.Context, _ bool) error {
	c.collect()
	pending := map[string]bool{}
	for _, item := range c.charts.List() {
		obj := item.(*unstructured.Unstructured)
		key := workKey(obj)
		if key == "" {
			continue
		}
		pending[key] = true
		chart := obj.GetNamespace() + "/" + obj.GetName()
		if c.busy[chart] || len(c.busy) >= workers || !c.failed.Due(key) {
			continue
		}
		c.busy[chart] = true
		c.workers.Go(func() { c.done <- result{chart: chart, key: key, err: c.sync(ctx, obj)} })
	}
	c.failed.Keep(pending)
	return nil
}

// collect takes in what the workers finished.
func (c *controller) collect() {
	for {
		select {
		case r := <-c.done:
			delete(c.busy, r.chart)
			f, isFailure := errors.AsType[*failure](r.err)
			switch {
			case r.err == nil:
				c.failed.Forget(r.key)
			case isFailure && f.final:
				c.failed.Refuse(r.key)
			default:
				log.WithError(r.err).WithField("helmchart", r.chart).Debug("retry later")
				c.failed.Fail(r.key)
			}
		default:
			return
		}
	}
}

// workKey names the work obj asks for, or is empty if it asks for none:
// a release to deploy for its spec's generation, or to uninstall.
func workKey(obj *unstructured.Unstructured) string {
	key := fmt.Sprintf("%s/%s@%d", obj.GetNamespace(), obj.GetName(), obj.GetGeneration())
	finalized := slices.Contains(obj.GetFinalizers(), Finalizer)
	if obj.GetDeletionTimestamp() != nil {
		if !finalized {
			return ""
		}
		return key + " uninstall"
	}
	if hc, err := decode(obj); err == nil && finalized && hc.deployed() {
		return ""
	}
	return key
}

// sync brings the release of obj in line with its spec, or uninstalls it
// once obj is being deleted; its status says how that went.
func (c *controller) sync(ctx context.Context, obj *unstructured.Unstructured) error {
	hc, err := decode(obj)
	if err != nil {
		// The CRD's schema leaves nothing to fail here; an older CRD might.
		log.WithError(err).Warn("HelmChart not read")
		return &failure{reason: ReasonSpecInvalid, err: err, final: true}
	}
	l := log.WithFields(logrus.Fields{"helmchart": hc.Namespace + "/" + hc.Name, "namespace": hc.releaseNamespace()})
	if hc.DeletionTimestamp != nil {
		if !slices.Contains(hc.Finalizers, Finalizer) {
			return nil
		}
		if err := c.releases.uninstall(hc.Name, hc.releaseNamespace(), hc.Spec); err != nil {
			return c.report(ctx, obj, hc, err, l)
		}
		if _, err := c.setFinalizer(ctx, obj, false); err != nil {
			return err
		}
		l.Info("release uninstalled")
		return nil
	}
	if !slices.Contains(hc.Finalizers, Finalizer) {
		if obj, err = c.setFinalizer(ctx, obj, true); err != nil {
			return err
		}
	}
	if hc.deployed() {
		return nil
	}
	rel, err := c.deploy(ctx, hc)
	if err != nil && ctx.Err() != nil {
		return err // stopping: the next start finishes the work
	}
	if err != nil {
		return c.report(ctx, obj, hc, err, l)
	}
	reason, verb := ReasonInstalled, "installed"
	if rel.Version > 1 {
		reason, verb = ReasonUpgraded, "upgraded"
	}
	status := hc.Status
	status.SpecHash, status.Revision, status.ChartVersion = hc.Spec.Hash(), rel.Version, rel.Chart.Metadata.Version
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: ConditionDeployed, Status: metav1.ConditionTrue, Reason: reason, ObservedGeneration: hc.Generation,
		Message: fmt.Sprintf("revision %d: chart %s %s", rel.Version, rel.Chart.Metadata.Name, rel.Chart.Metadata.Version),
	})
	l.WithFields(logrus.Fields{"chart": rel.Chart.Metadata.Name, "version": rel.Chart.Metadata.Version, "revision": rel.Version}).Info("release " + verb)
	return c.writeStatus(ctx, obj, hc.Status, status)
}

func (c *controller) deploy(ctx context.Context, hc helmChart) (*release.Release, error) {
	ch, err := c.fetch.load(ctx, hc.Spec)
	if err != nil {
		return nil, err
	}
	vals, err := hc.Spec.Values()
	if err != nil {
		return nil, &failure{reason: ReasonValuesInvalid, err: err, final: true}
	}
	return c.releases.deploy(ctx, hc.Name, hc.Spec, hc.releaseNamespace(), ch, vals)
}

// report records err in obj's status, once for each new message, and
// returns it.
func (c *controller) report(ctx context.Context, obj *unstructured.Unstructured, hc helmChart, err error, l *logrus.Entry) error {
	reason := reasonOf(err)
	if hc.DeletionTimestamp != nil {
		reason = ReasonUninstallFailed
	}
	status := hc.Status
	status.SpecHash = hc.Spec.Hash()
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: ConditionDeployed, Status: metav1.ConditionFalse, Reason: reason, ObservedGeneration: hc.Generation, Message: err.Error(),
	})
	if !reflect.DeepEqual(status, hc.Status) {
		l.WithError(err).WithField("reason", reason).Warn("release not deployed")
	}
	if werr := c.writeStatus(ctx, obj, hc.Status, status); werr != nil {
		return errors.Join(err, werr)
	}
	return err
}

// writeStatus writes status as obj's if it differs from was.
func (c *controller) writeStatus(ctx context.Context, obj *unstructured.Unstructured, was, status Status) error {
	if reflect.DeepEqual(was, status) {
		return nil
	}
	b, err := json.Marshal(status)
	if err != nil {
		return err
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		return err
	}
	updated := obj.DeepCopy()
	updated.Object["status"] = fields
	if _, err := c.dynamic.Resource(Resource).Namespace(obj.GetNamespace()).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update the status of HelmChart %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// setFinalizer adds or removes Finalizer on obj and returns the object the
// apiserver stored.
func (c *controller) setFinalizer(ctx context.Context, obj *unstructured.Unstructured, on bool) (*unstructured.Unstructured, error) {
	updated := obj.DeepCopy()
	finalizers := slices.DeleteFunc(updated.GetFinalizers(), func(f string) bool { return f == Finalizer })
	if on {
		finalizers = append(finalizers, Finalizer)
	}
	updated.SetFinalizers(finalizers)
	stored, err := c.dynamic.Resource(Resource).Namespace(obj.GetNamespace()).Update(ctx, updated, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("set the finalizer of HelmChart %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return stored, nil
}
