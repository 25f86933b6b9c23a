package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gatewayinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/kelp-dev/kelp/internal/apply"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/crd"
	"github.com/kelp-dev/kelp/internal/informer"
	"github.com/kelp-dev/kelp/internal/reconcile"
)

// Every change recompiles everything, coalesce after it: at a homelab's
// scale that costs less than tracking what depends on what. A pass whose
// writes of status or of the Config failed is tried again on the retry
// tick; other ticks do nothing.
const (
	coalesce = 100 * time.Millisecond
	retry    = 30 * time.Second
)

// Controller compiles the cluster's Gateway API objects, writes their
// status and publishes the data path's Config.
type Controller struct {
	kube    kubernetes.Interface
	gateway gatewayclient.Interface

	// kubeInformers are the server's cache.
	kubeInformers *informer.Cache
	// tlsInformers hold only Secrets of type kubernetes.io/tls: a
	// cluster's other Secrets are no certificates and would only cost
	// memory here, or in the server's cache.
	tlsInformers informers.SharedInformerFactory
	// gatewayInformers are of another clientset, which the server's
	// cache cannot hold.
	gatewayInformers gatewayinformers.SharedInformerFactory
	// failed says the last pass could not write all it had to.
	failed bool
	// published is the Config last written to the Secret.
	published []byte
	// addressRanges are the server's --gateway-address-range; held are
	// the holders of the addresses the last Config published named.
	addressRanges []config.AddressRange
	held          []HeldAddress
}

// Run writes status and the data path's Config until ctx ends; Gateways
// get addresses of their own from addressRanges, if any.
func Run(ctx context.Context, kube kubernetes.Interface, gw gatewayclient.Interface, kubeInformers *informer.Cache, addressRanges []config.AddressRange) error {
	c := &Controller{
		kube:          kube,
		gateway:       gw,
		addressRanges: addressRanges,
		kubeInformers: kubeInformers,
		tlsInformers: informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("type", string(corev1.SecretTypeTLS)).String()
		})),
		gatewayInformers: gatewayinformers.NewSharedInformerFactory(gw, 0),
	}
	c.held = publishedHolders(ctx, kube)
	g, k, t := c.gatewayInformers.Gateway(), c.kubeInformers, c.tlsInformers
	// The controller's own factories end with this run; the cache's
	// informers run on for the server's other controllers.
	ctx, cancel := context.WithCancel(ctx)
	defer c.gatewayInformers.Shutdown()
	defer t.Shutdown()
	defer cancel()
	return reconcile.Loop{
		Informers: map[string]cache.SharedIndexInformer{
			"gatewayclasses":  g.V1().GatewayClasses().Informer(),
			"gateways":        g.V1().Gateways().Informer(),
			"httproutes":      g.V1().HTTPRoutes().Informer(),
			"referencegrants": g.V1beta1().ReferenceGrants().Informer(),
			"services":        k.Core().V1().Services().Informer(),
			"tls secrets":     t.Core().V1().Secrets().Informer(),
			"namespaces":      k.Core().V1().Namespaces().Informer(),
			"nodes":           k.Core().V1().Nodes().Informer(),
			"ingresses":       k.Networking().V1().Ingresses().Informer(),
		},
		Start: func() {
			k.Start()
			t.Start(ctx.Done())
			c.gatewayInformers.Start(ctx.Done())
		},
		Coalesce: coalesce,
		Resync:   retry,
		Sync: func(ctx context.Context, resync bool) error {
			if resync && !c.failed {
				return nil
			}
			err := c.sync(ctx)
			c.failed = err != nil
			if err != nil && ctx.Err() == nil {
				log.WithError(err).Warn("gateway status; trying again")
			}
			return nil
		},
	}.Run(ctx)
}

func (c *Controller) objects() (Objects, error) {
	o := Objects{AddressRanges: c.addressRanges, Held: c.held}
	var err error
	everything := labels.Everything()
	gw := c.gatewayInformers.Gateway()
	if o.GatewayClasses, err = gw.V1().GatewayClasses().Lister().List(everything); err != nil {
		return o, err
	}
	if o.Gateways, err = gw.V1().Gateways().Lister().List(everything); err != nil {
		return o, err
	}
	if o.HTTPRoutes, err = gw.V1().HTTPRoutes().Lister().List(everything); err != nil {
		return o, err
	}
	if o.ReferenceGrants, err = gw.V1beta1().ReferenceGrants().Lister().List(everything); err != nil {
		return o, err
	}
	core := c.kubeInformers.Core().V1()
	if o.Services, err = core.Services().Lister().List(everything); err != nil {
		return o, err
	}
	if o.Secrets, err = c.tlsInformers.Core().V1().Secrets().Lister().List(everything); err != nil {
		return o, err
	}
	if o.Namespaces, err = core.Namespaces().Lister().List(everything); err != nil {
		return o, err
	}
	if o.Nodes, err = core.Nodes().Lister().List(everything); err != nil {
		return o, err
	}
	if o.Ingresses, err = c.kubeInformers.Networking().V1().Ingresses().Lister().List(everything); err != nil {
		return o, err
	}
	return o, nil
}

func (c *Controller) sync(ctx context.Context) error {
	objs, err := c.objects()
	if err != nil {
		return err
	}
	cfg, st := Compile(objs)
	var firstErr error
	keep := func(err error) {
		if err != nil && firstErr == nil && !apierrors.IsNotFound(err) {
			firstErr = err
		}
	}
	// A Config that cannot be published does not hold up the status of
	// every object: it is what tells their owners what is wrong.
	if err := c.publish(ctx, cfg); err != nil {
		keep(err)
	} else {
		c.held = cfg.Addresses
	}
	for _, gc := range objs.GatewayClasses {
		if s, ok := st.GatewayClasses[gc.Name]; ok {
			keep(c.writeClass(ctx, gc, s))
		}
	}
	for _, gw := range objs.Gateways {
		if s, ok := st.Gateways[nameOf(gw)]; ok {
			keep(c.writeGateway(ctx, gw, s))
		}
	}
	for _, r := range objs.HTTPRoutes {
		keep(c.writeRoute(ctx, r, st.HTTPRoutes[nameOf(r)]))
	}
	for _, ing := range objs.Ingresses {
		if lb, ok := st.Ingresses[nameOf(ing)]; ok {
			keep(c.writeIngress(ctx, ing, lb))
		}
	}
	return firstErr
}

// publish writes cfg to the Secret the nodes read, when it changed.
func (c *Controller) publish(ctx context.Context, cfg Config) error {
	data, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if string(data) == string(c.published) {
		return nil
	}
	secret := corev1ac.Secret(ConfigSecret, metav1.NamespaceSystem).
		WithType(corev1.SecretTypeOpaque).
		WithData(map[string][]byte{ConfigKey: data})
	if _, err := c.kube.CoreV1().Secrets(metav1.NamespaceSystem).Apply(ctx, secret, apply.Options()); err != nil {
		return fmt.Errorf("publish the gateway configuration in the Secret %s/%s: %w", metav1.NamespaceSystem, ConfigSecret, err)
	}
	c.published = data
	return nil
}

// publishedHolders are the holders of the addresses in the Config the
// Secret holds: those a controller before this one chose. None if there
// is no Secret or it cannot be read; then the holders are chosen anew.
func publishedHolders(ctx context.Context, kube kubernetes.Interface) []HeldAddress {
	s, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, ConfigSecret, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	var cfg Config
	if json.Unmarshal(s.Data[ConfigKey], &cfg) != nil {
		return nil
	}
	return cfg.Addresses
}

// mergeConditions returns want with the LastTransitionTime of old
// conditions whose status did not change, and now for the others.
func mergeConditions(old, want []metav1.Condition) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(want))
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	for _, w := range want {
		w.LastTransitionTime = now
		if o := apimeta.FindStatusCondition(old, w.Type); o != nil && o.Status == w.Status {
			w.LastTransitionTime = o.LastTransitionTime
		}
		out = append(out, w)
	}
	return out
}

func (c *Controller) writeClass(ctx context.Context, gc *gatewayv1.GatewayClass, want gatewayv1.GatewayClassStatus) error {
	want.Conditions = mergeConditions(gc.Status.Conditions, want.Conditions)
	if reflect.DeepEqual(gc.Status, want) {
		return nil
	}
	gc = gc.DeepCopy()
	gc.Status = want
	_, err := c.gateway.GatewayV1().GatewayClasses().UpdateStatus(ctx, gc, metav1.UpdateOptions{})
	return err
}

func (c *Controller) writeGateway(ctx context.Context, gw *gatewayv1.Gateway, want gatewayv1.GatewayStatus) error {
	want.Conditions = mergeConditions(gw.Status.Conditions, want.Conditions)
	for i := range want.Listeners {
		var old []metav1.Condition
		for _, l := range gw.Status.Listeners {
			if l.Name == want.Listeners[i].Name {
				old = l.Conditions
			}
		}
		want.Listeners[i].Conditions = mergeConditions(old, want.Listeners[i].Conditions)
	}
	if reflect.DeepEqual(gw.Status, want) {
		return nil
	}
	gw = gw.DeepCopy()
	gw.Status = want
	_, err := c.gateway.GatewayV1().Gateways(gw.Namespace).UpdateStatus(ctx, gw, metav1.UpdateOptions{})
	return err
}

// writeRoute sets kelp's entries of the route's status.parents, keeping
// those of other controllers.
func (c *Controller) writeRoute(ctx context.Context, r *gatewayv1.HTTPRoute, want []gatewayv1.RouteParentStatus) error {
	var parents []gatewayv1.RouteParentStatus
	for _, p := range r.Status.Parents {
		if p.ControllerName != ControllerName {
			parents = append(parents, p)
		}
	}
	for _, w := range want {
		var old []metav1.Condition
		for _, p := range r.Status.Parents {
			if p.ControllerName == ControllerName && reflect.DeepEqual(p.ParentRef, w.ParentRef) {
				old = p.Conditions
			}
		}
		w.Conditions = mergeConditions(old, w.Conditions)
		parents = append(parents, w)
	}
	if parents == nil {
		parents = []gatewayv1.RouteParentStatus{}
	}
	if equalParents(r.Status.Parents, parents) {
		return nil
	}
	r = r.DeepCopy()
	r.Status.Parents = parents
	_, err := c.gateway.GatewayV1().HTTPRoutes(r.Namespace).UpdateStatus(ctx, r, metav1.UpdateOptions{})
	return err
}

func equalParents(a, b []gatewayv1.RouteParentStatus) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}

// ControllerConfig is what the server's controller needs.
type ControllerConfig struct {
	// Client, Kube and Extensions are the admin's: status of any
	// namespace's objects, and the Secrets that hold listeners'
	// certificates.
	Client     *rest.Config
	Kube       kubernetes.Interface
	Extensions apiextensionsclient.Interface
	// CRDs are the Gateway API CRDs to apply first (embed.GatewayCRDs).
	CRDs fs.FS
	// LeaderElection makes the servers that share a datastore take turns.
	LeaderElection bool
	// AddressRanges are --gateway-address-range.
	AddressRanges []config.AddressRange
	// Informers are the server's cache, of which the controller reads
	// Services, Namespaces, Nodes and Ingresses.
	Informers *informer.Cache
}

// RunController applies the CRDs and the GatewayClass kelp, then runs the
// controller until ctx ends (while this server leads, with
// LeaderElection).
func RunController(ctx context.Context, cfg ControllerConfig) error {
	gw, err := gatewayclient.NewForConfig(cfg.Client)
	if err != nil {
		return err
	}
	if err := crd.Retry(ctx, "install the Gateway API CRDs", func(ctx context.Context) error {
		return Install(ctx, cfg.Kube, cfg.Extensions, gw, cfg.CRDs)
	}); err != nil {
		return err
	}
	run := func(ctx context.Context) error { return Run(ctx, cfg.Kube, gw, cfg.Informers, cfg.AddressRanges) }
	if !cfg.LeaderElection {
		return run(ctx)
	}
	return lead(ctx, cfg.Kube, run)
}

func (c *Controller) writeIngress(ctx context.Context, ing *networkingv1.Ingress, lb []networkingv1.IngressLoadBalancerIngress) error {
	if reflect.DeepEqual(ing.Status.LoadBalancer.Ingress, lb) || (len(lb) == 0 && len(ing.Status.LoadBalancer.Ingress) == 0) {
		return nil
	}
	ing = ing.DeepCopy()
	ing.Status.LoadBalancer.Ingress = lb
	_, err := c.kube.NetworkingV1().Ingresses(ing.Namespace).UpdateStatus(ctx, ing, metav1.UpdateOptions{})
	return err
}
