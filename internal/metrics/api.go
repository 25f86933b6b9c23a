package metrics

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"mime"
	"net/http"
	"slices"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

var (
	groupVersion     = metricsv1beta1.SchemeGroupVersion
	groupVersionPath = "/apis/" + groupVersion.String()
	nodesResource    = groupVersion.WithResource("nodes").GroupResource()
	podsResource     = groupVersion.WithResource("pods").GroupResource()
)

// discoveryMedia is the aggregated discovery format (apidiscovery.k8s.io/v2).
const discoveryMedia = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

// API serves metrics.k8s.io/v1beta1 from a Store. It knows nodes and pods
// from listers: label selectors match their labels, which the kubelets'
// figures do not carry.
type API struct {
	store *Store
	nodes corelisters.NodeLister
	// pods lists *metav1.PartialObjectMetadata: labels are all it needs.
	pods cache.GenericLister
	docs discovery
}

// NewAPI returns the handler of the metrics API. Every answer is JSON,
// which is what kubectl and the HPA's client decode whatever they accept.
func NewAPI(store *Store, nodes corelisters.NodeLister, pods cache.GenericLister) http.Handler {
	a := &API{store: store, nodes: nodes, pods: pods, docs: newDiscovery()}
	mux := http.NewServeMux()
	mux.HandleFunc("/apis", a.serveGroups)
	mux.HandleFunc("/apis/"+groupVersion.Group, serve(&a.docs.group))
	mux.HandleFunc(groupVersionPath, serve(&a.docs.resources))
	mux.HandleFunc(groupVersionPath+"/nodes", a.listNodes)
	mux.HandleFunc(groupVersionPath+"/nodes/{name}", a.getNode)
	mux.HandleFunc(groupVersionPath+"/pods", a.listPods)
	mux.HandleFunc(groupVersionPath+"/namespaces/{namespace}/pods", a.listPods)
	mux.HandleFunc(groupVersionPath+"/namespaces/{namespace}/pods/{name}", a.getPod)
	// The aggregator fetches the OpenAPI spec every minute: a 404 it
	// takes for a failure and logs, an empty spec for "nothing to add".
	// For /openapi/v3 a 404 means "convert v2".
	mux.HandleFunc("/openapi/v2", func(w http.ResponseWriter, r *http.Request) {
		writeCached(w, r, "application/json", []byte(openAPIv2))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeStatus(w, &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
			Message: "the server could not find the requested resource",
		}})
	})
	group := schema.GroupResource{Group: groupVersion.Group}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeStatus(w, apierrors.NewMethodNotSupported(group, strings.ToLower(r.Method)))
			return
		}
		if watch := r.URL.Query().Get("watch"); watch == "true" || watch == "1" {
			writeStatus(w, apierrors.NewMethodNotSupported(group, "watch"))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (a *API) listNodes(w http.ResponseWriter, r *http.Request) {
	sel, err := selectorsOf(r)
	if err != nil {
		writeStatus(w, err)
		return
	}
	nodes, err := a.nodes.List(sel.labels)
	if err != nil {
		writeStatus(w, apierrors.NewInternalError(err))
		return
	}
	list := &metricsv1beta1.NodeMetricsList{
		TypeMeta: metav1.TypeMeta{Kind: "NodeMetricsList", APIVersion: groupVersion.String()},
		Items:    []metricsv1beta1.NodeMetrics{},
	}
	for _, n := range nodes {
		if !sel.fields.Matches(fields.Set{"metadata.name": n.Name}) {
			continue
		}
		if u, ok := a.store.Node(n.Name); ok {
			list.Items = append(list.Items, a.nodeMetrics(n, u))
		}
	}
	slices.SortFunc(list.Items, func(x, y metricsv1beta1.NodeMetrics) int { return strings.Compare(x.Name, y.Name) })
	writeJSON(w, http.StatusOK, list)
}

func (a *API) getNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	n, err := a.nodes.Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		writeStatus(w, apierrors.NewInternalError(err))
		return
	}
	u, ok := a.store.Node(name)
	if err != nil || !ok {
		writeStatus(w, apierrors.NewNotFound(nodesResource, name))
		return
	}
	m := a.nodeMetrics(n, u)
	m.TypeMeta = metav1.TypeMeta{Kind: "NodeMetrics", APIVersion: groupVersion.String()}
	writeJSON(w, http.StatusOK, &m)
}

func (a *API) nodeMetrics(n *corev1.Node, u Usage) metricsv1beta1.NodeMetrics {
	return metricsv1beta1.NodeMetrics{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels, CreationTimestamp: metav1.Now()},
		Timestamp:  metav1.NewTime(u.Time),
		Window:     metav1.Duration{Duration: u.Window},
		Usage:      resources(u),
	}
}

func (a *API) listPods(w http.ResponseWriter, r *http.Request) {
	sel, err := selectorsOf(r)
	if err != nil {
		writeStatus(w, err)
		return
	}
	var pods []runtime.Object
	if ns := r.PathValue("namespace"); ns != "" {
		pods, err = a.pods.ByNamespace(ns).List(sel.labels)
	} else {
		pods, err = a.pods.List(sel.labels)
	}
	if err != nil {
		writeStatus(w, apierrors.NewInternalError(err))
		return
	}
	list := &metricsv1beta1.PodMetricsList{
		TypeMeta: metav1.TypeMeta{Kind: "PodMetricsList", APIVersion: groupVersion.String()},
		Items:    []metricsv1beta1.PodMetrics{},
	}
	for _, obj := range pods {
		pod, err := meta.Accessor(obj)
		if err != nil {
			continue
		}
		if !sel.fields.Matches(fields.Set{"metadata.name": pod.GetName(), "metadata.namespace": pod.GetNamespace()}) {
			continue
		}
		if u, ok := a.store.Pod(pod.GetNamespace(), pod.GetName()); ok {
			list.Items = append(list.Items, a.podMetrics(pod, u))
		}
	}
	slices.SortFunc(list.Items, func(x, y metricsv1beta1.PodMetrics) int {
		return strings.Compare(x.Namespace+"/"+x.Name, y.Namespace+"/"+y.Name)
	})
	writeJSON(w, http.StatusOK, list)
}

func (a *API) getPod(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	obj, err := a.pods.ByNamespace(ns).Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		writeStatus(w, apierrors.NewInternalError(err))
		return
	}
	var pod metav1.Object
	if err == nil {
		pod, err = meta.Accessor(obj)
	}
	u, ok := a.store.Pod(ns, name)
	if err != nil || !ok {
		writeStatus(w, apierrors.NewNotFound(podsResource, name))
		return
	}
	m := a.podMetrics(pod, u)
	m.TypeMeta = metav1.TypeMeta{Kind: "PodMetrics", APIVersion: groupVersion.String()}
	writeJSON(w, http.StatusOK, &m)
}

func (a *API) podMetrics(pod metav1.Object, u PodUsage) metricsv1beta1.PodMetrics {
	m := metricsv1beta1.PodMetrics{
		ObjectMeta: metav1.ObjectMeta{Name: pod.GetName(), Namespace: pod.GetNamespace(), Labels: pod.GetLabels(), CreationTimestamp: metav1.Now()},
		Timestamp:  metav1.NewTime(u.Time),
		Window:     metav1.Duration{Duration: u.Window},
		Containers: []metricsv1beta1.ContainerMetrics{},
	}
	for _, name := range slices.Sorted(maps.Keys(u.Containers)) {
		m.Containers = append(m.Containers, metricsv1beta1.ContainerMetrics{Name: name, Usage: resources(u.Containers[name])})
	}
	return m
}

// resources spells usage as metrics-server does: CPU in nanocores, memory
// in bytes.
func resources(u Usage) corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewScaledQuantity(int64(math.Round(u.CPU*1e9)), resource.Nano),
		corev1.ResourceMemory: *resource.NewQuantity(int64(u.Memory), resource.BinarySI),
	}
}

type selectors struct {
	labels labels.Selector
	fields fields.Selector
}

// selectorsOf reads labelSelector and fieldSelector (metadata.name, and
// metadata.namespace for pods) as kubectl top and the HPA send them.
func selectorsOf(r *http.Request) (selectors, error) {
	q := r.URL.Query()
	ls, err := labels.Parse(q.Get("labelSelector"))
	if err != nil {
		return selectors{}, apierrors.NewBadRequest(fmt.Sprintf("labelSelector: %v", err))
	}
	fs, err := fields.ParseSelector(q.Get("fieldSelector"))
	if err != nil {
		return selectors{}, apierrors.NewBadRequest(fmt.Sprintf("fieldSelector: %v", err))
	}
	return selectors{labels: ls, fields: fs}, nil
}

func (a *API) serveGroups(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Vary", "Accept")
	if !acceptsAggregatedDiscovery(r.Header.Get("Accept")) {
		writeJSON(w, http.StatusOK, &a.docs.groups)
		return
	}
	data, err := json.Marshal(&a.docs.aggregated)
	if err != nil {
		writeStatus(w, err)
		return
	}
	writeCached(w, r, discoveryMedia, data)
}

// openAPIv2 is an OpenAPI spec without paths: all the aggregator needs to
// merge into the apiserver's (`kubectl explain` does not know the metrics
// types, which kubectl top and the HPA do not ask it about).
const openAPIv2 = `{"swagger":"2.0","info":{"title":"metrics.k8s.io","version":"v1beta1"},"paths":{}}`

// writeCached answers with data and its ETag, or with a 304 to a client
// that has it: the aggregator asks for discovery and the OpenAPI spec
// every minute.
func writeCached(w http.ResponseWriter, r *http.Request, media string, data []byte) {
	sum := sha256.Sum256(data)
	etag := `"` + hex.EncodeToString(sum[:16]) + `"`
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	writeRaw(w, http.StatusOK, media, data)
}

// acceptsAggregatedDiscovery says whether an Accept header asks for
// apidiscovery.k8s.io/v2, as the aggregator and new clients do.
func acceptsAggregatedDiscovery(accept string) bool {
	for _, part := range strings.Split(accept, ",") {
		media, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err == nil && media == "application/json" &&
			params["g"] == "apidiscovery.k8s.io" && params["v"] == "v2" && params["as"] == "APIGroupDiscoveryList" {
			return true
		}
	}
	return false
}

func serve(doc any) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, doc) }
}

// discovery holds the documents that say what the API serves.
type discovery struct {
	resources  metav1.APIResourceList
	group      metav1.APIGroup
	groups     metav1.APIGroupList
	aggregated apidiscoveryv2.APIGroupDiscoveryList
}

func newDiscovery() discovery {
	gv := metav1.GroupVersionForDiscovery{GroupVersion: groupVersion.String(), Version: groupVersion.Version}
	group := metav1.APIGroup{
		TypeMeta:         metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"},
		Name:             groupVersion.Group,
		Versions:         []metav1.GroupVersionForDiscovery{gv},
		PreferredVersion: gv,
	}
	list := metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: groupVersion.String()}
	var aggregated []apidiscoveryv2.APIResourceDiscovery
	verbs := []string{"get", "list"}
	for _, r := range []struct {
		name, kind string
		namespaced bool
	}{
		{"nodes", "NodeMetrics", false},
		{"pods", "PodMetrics", true},
	} {
		list.APIResources = append(list.APIResources, metav1.APIResource{Name: r.name, Kind: r.kind, Namespaced: r.namespaced, Verbs: verbs})
		scope := apidiscoveryv2.ScopeCluster
		if r.namespaced {
			scope = apidiscoveryv2.ScopeNamespace
		}
		aggregated = append(aggregated, apidiscoveryv2.APIResourceDiscovery{
			Resource:     r.name,
			ResponseKind: &metav1.GroupVersionKind{Group: groupVersion.Group, Version: groupVersion.Version, Kind: r.kind},
			Scope:        scope,
			Verbs:        verbs,
		})
	}
	return discovery{
		resources: list,
		group:     group,
		groups:    metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{group}},
		aggregated: apidiscoveryv2.APIGroupDiscoveryList{
			TypeMeta: metav1.TypeMeta{Kind: "APIGroupDiscoveryList", APIVersion: apidiscoveryv2.SchemeGroupVersion.String()},
			Items: []apidiscoveryv2.APIGroupDiscovery{{
				ObjectMeta: metav1.ObjectMeta{Name: groupVersion.Group},
				Versions: []apidiscoveryv2.APIVersionDiscovery{{
					Version:   groupVersion.Version,
					Resources: aggregated,
					Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent,
				}},
			}},
		},
	}
}

func writeStatus(w http.ResponseWriter, err error) {
	var status metav1.Status
	if se, ok := err.(apierrors.APIStatus); ok {
		status = se.Status()
	} else {
		status = apierrors.NewInternalError(err).Status()
	}
	status.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	writeJSON(w, int(status.Code), &status)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeRaw(w, code, "application/json", data)
}

func writeRaw(w http.ResponseWriter, code int, media string, data []byte) {
	w.Header().Set("Content-Type", media)
	w.WriteHeader(code)
	_, _ = w.Write(data)
}
