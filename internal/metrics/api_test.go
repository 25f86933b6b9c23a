package metrics

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	discoveryclient "k8s.io/client-go/discovery"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// testAPI serves: node-a and node-b with figures, node-c (known, no
// figures yet); pods web-1 and web-2 (app=web) and db-0 in default, dns
// in kube-system, all with figures but db-0.
func testAPI(t *testing.T) http.Handler {
	t.Helper()
	store := NewStore()
	t1 := t0.Add(15 * time.Second)
	container := func(ns, pod, c string, cpu float64, at time.Time) (ContainerKey, Sample) {
		return ContainerKey{ns, pod, c}, Sample{Time: at, CPU: cpu, Memory: 64 << 20}
	}
	for _, node := range []struct {
		name string
		pods [][3]string // namespace, pod, container
	}{
		{"node-a", [][3]string{{"default", "web-1", "web"}, {"default", "web-1", "log"}, {"kube-system", "dns", "dns"}}},
		{"node-b", [][3]string{{"default", "web-2", "web"}}},
	} {
		for i, at := range []time.Time{t0, t1} {
			r := reading(at, float64(10+3*i), map[ContainerKey]Sample{})
			for _, p := range node.pods {
				k, s := container(p[0], p[1], p[2], float64(i)*1.5, at)
				r.Containers[k] = s
			}
			store.Add(node.name, r)
		}
	}
	nodes := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for name, role := range map[string]string{"node-a": "edge", "node-b": "core", "node-c": "edge"} {
		_ = nodes.Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"role": role}}})
	}
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, p := range []struct{ ns, name, app string }{
		{"default", "web-1", "web"}, {"default", "web-2", "web"}, {"default", "db-0", "db"}, {"kube-system", "dns", "dns"},
	} {
		_ = pods.Add(&metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, Labels: map[string]string{"app": p.app}}})
	}
	return NewAPI(store, corelisters.NewNodeLister(nodes), cache.NewGenericLister(pods, corev1.Resource("pods")))
}

func get(t *testing.T, h http.Handler, path string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func decode(t *testing.T, w *httptest.ResponseRecorder, code int, into any) {
	t.Helper()
	if w.Code != code {
		t.Fatalf("status %d, want %d: %s", w.Code, code, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); code != http.StatusNotModified && ct != "application/json" && ct != discoveryMedia {
		t.Errorf("content type %q", ct)
	}
	if into != nil {
		if err := json.Unmarshal(w.Body.Bytes(), into); err != nil {
			t.Fatalf("%v: %s", err, w.Body)
		}
	}
}

func TestAPINodes(t *testing.T) {
	h := testAPI(t)
	var list metricsv1beta1.NodeMetricsList
	decode(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/nodes"), http.StatusOK, &list)
	if list.Kind != "NodeMetricsList" || list.APIVersion != "metrics.k8s.io/v1beta1" {
		t.Errorf("list is %s %s", list.APIVersion, list.Kind)
	}
	if names := nodeNames(list); !slices.Equal(names, []string{"node-a", "node-b"}) {
		t.Errorf("nodes %v, want node-a and node-b (node-c has no figures yet)", names)
	}
	a := list.Items[0]
	if cpu := a.Usage.Cpu().MilliValue(); cpu != 200 {
		t.Errorf("node-a uses %dm CPU, want 3 core-seconds over 15 s: 200m", cpu)
	}
	if mem := a.Usage.Memory().Value(); mem != 1<<30 {
		t.Errorf("node-a uses %d bytes", mem)
	}
	if a.Window.Duration != 15*time.Second || !a.Timestamp.Time.Equal(t0.Add(15*time.Second)) || a.Labels["role"] != "edge" {
		t.Errorf("node-a %+v", a)
	}

	decode(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/nodes?labelSelector=role%3Dedge"), http.StatusOK, &list)
	if names := nodeNames(list); !slices.Equal(names, []string{"node-a"}) {
		t.Errorf("role=edge: %v", names)
	}
	decode(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/nodes?fieldSelector=metadata.name%3Dnode-b"), http.StatusOK, &list)
	if names := nodeNames(list); !slices.Equal(names, []string{"node-b"}) {
		t.Errorf("metadata.name=node-b: %v", names)
	}
	w := get(t, h, "/apis/metrics.k8s.io/v1beta1/nodes?labelSelector=role%3Dnone")
	if decode(t, w, http.StatusOK, &list); len(list.Items) != 0 || !json.Valid(w.Body.Bytes()) || !strings.Contains(w.Body.String(), `"items":[]`) {
		t.Errorf("an empty list must be [], not null: %s", w.Body)
	}

	var one metricsv1beta1.NodeMetrics
	decode(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/nodes/node-b"), http.StatusOK, &one)
	if one.Kind != "NodeMetrics" || one.Name != "node-b" {
		t.Errorf("node-b: %+v", one)
	}
	for _, name := range []string{"node-c", "node-z"} {
		notFound(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/nodes/"+name), "nodes", name)
	}
}

func TestAPIPods(t *testing.T) {
	h := testAPI(t)
	var list metricsv1beta1.PodMetricsList
	decode(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"), http.StatusOK, &list)
	if names := podNames(list); !slices.Equal(names, []string{"default/web-1", "default/web-2"}) {
		t.Errorf("default: %v (db-0 has no figures)", names)
	}
	web1 := list.Items[0]
	if len(web1.Containers) != 2 || web1.Containers[0].Name != "log" || web1.Containers[1].Name != "web" {
		t.Fatalf("web-1 containers %+v, want log and web", web1.Containers)
	}
	if cpu := web1.Containers[1].Usage.Cpu().MilliValue(); cpu != 100 {
		t.Errorf("web uses %dm, want 100m", cpu)
	}
	if web1.Window.Duration != 15*time.Second || web1.Labels["app"] != "web" || web1.Namespace != "default" {
		t.Errorf("web-1 %+v", web1)
	}

	// What the HPA asks for.
	decode(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods?labelSelector=app%3Dweb"), http.StatusOK, &list)
	if names := podNames(list); !slices.Equal(names, []string{"default/web-1", "default/web-2"}) {
		t.Errorf("app=web: %v", names)
	}
	decode(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods?labelSelector=app+in+(web,db),app!%3Dweb"), http.StatusOK, &list)
	if len(list.Items) != 0 {
		t.Errorf("app in (web,db),app!=web: %v", podNames(list))
	}
	decode(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods?fieldSelector=metadata.name%3Dweb-2"), http.StatusOK, &list)
	if names := podNames(list); !slices.Equal(names, []string{"default/web-2"}) {
		t.Errorf("metadata.name=web-2: %v", names)
	}
	// kubectl top pods -A
	decode(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/pods"), http.StatusOK, &list)
	if names := podNames(list); !slices.Equal(names, []string{"default/web-1", "default/web-2", "kube-system/dns"}) {
		t.Errorf("all namespaces: %v", names)
	}

	var one metricsv1beta1.PodMetrics
	decode(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/namespaces/kube-system/pods/dns"), http.StatusOK, &one)
	if one.Kind != "PodMetrics" || one.Name != "dns" || len(one.Containers) != 1 {
		t.Errorf("dns: %+v", one)
	}
	notFound(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/db-0"), "pods", "db-0")
	notFound(t, get(t, h, "/apis/metrics.k8s.io/v1beta1/namespaces/kube-system/pods/web-1"), "pods", "web-1")

	w := get(t, h, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods?labelSelector=app+in+(")
	var status metav1.Status
	if decode(t, w, http.StatusBadRequest, &status); status.Reason != metav1.StatusReasonBadRequest {
		t.Errorf("a bad selector: %+v", status)
	}
}

func TestAPIDiscovery(t *testing.T) {
	h := testAPI(t)
	var resources metav1.APIResourceList
	decode(t, get(t, h, "/apis/metrics.k8s.io/v1beta1"), http.StatusOK, &resources)
	if resources.GroupVersion != "metrics.k8s.io/v1beta1" || len(resources.APIResources) != 2 {
		t.Fatalf("resources %+v", resources)
	}
	for i, want := range []metav1.APIResource{
		{Name: "nodes", Kind: "NodeMetrics", Namespaced: false, Verbs: []string{"get", "list"}},
		{Name: "pods", Kind: "PodMetrics", Namespaced: true, Verbs: []string{"get", "list"}},
	} {
		if got := resources.APIResources[i]; got.Name != want.Name || got.Kind != want.Kind || got.Namespaced != want.Namespaced || !slices.Equal(got.Verbs, want.Verbs) {
			t.Errorf("resource %+v, want %+v", got, want)
		}
	}

	var groups metav1.APIGroupList
	decode(t, get(t, h, "/apis", "Accept", "application/json"), http.StatusOK, &groups)
	if len(groups.Groups) != 1 || groups.Groups[0].PreferredVersion.GroupVersion != "metrics.k8s.io/v1beta1" {
		t.Errorf("groups %+v", groups)
	}

	// What the aggregator asks for, and how it tells the answer's format.
	w := get(t, h, "/apis", "Accept", discoveryclient.AcceptV2+","+discoveryclient.AcceptV1)
	var aggregated apidiscoveryv2.APIGroupDiscoveryList
	decode(t, w, http.StatusOK, &aggregated)
	if ok, err := discoveryclient.ContentTypeIsGVK(w.Header().Get("Content-Type"), apidiscoveryv2.SchemeGroupVersion.WithKind("APIGroupDiscoveryList")); !ok || err != nil {
		t.Errorf("content type %q is not aggregated discovery v2 (%v)", w.Header().Get("Content-Type"), err)
	}
	if len(aggregated.Items) != 1 || len(aggregated.Items[0].Versions) != 1 || len(aggregated.Items[0].Versions[0].Resources) != 2 {
		t.Fatalf("aggregated discovery %+v", aggregated)
	}
	if r := aggregated.Items[0].Versions[0].Resources[1]; r.Resource != "pods" || r.Scope != apidiscoveryv2.ScopeNamespace || r.ResponseKind.Kind != "PodMetrics" {
		t.Errorf("pods: %+v", r)
	}
	etag := w.Header().Get("ETag")
	decode(t, get(t, h, "/apis", "Accept", discoveryclient.AcceptV2, "If-None-Match", etag), http.StatusNotModified, nil)

	w = get(t, h, "/openapi/v2", "Accept", "application/json")
	var spec map[string]any
	if decode(t, w, http.StatusOK, &spec); spec["swagger"] != "2.0" {
		t.Errorf("openapi v2: %s", w.Body)
	}
	decode(t, get(t, h, "/openapi/v2", "If-None-Match", w.Header().Get("ETag")), http.StatusNotModified, nil)
	notFound(t, get(t, h, "/openapi/v3"), "", "")
}

func TestAPIRefusesWhatItDoesNotServe(t *testing.T) {
	h := testAPI(t)
	for _, req := range []*http.Request{
		httptest.NewRequest(http.MethodPost, "/apis/metrics.k8s.io/v1beta1/nodes", nil),
		httptest.NewRequest(http.MethodDelete, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web-1", nil),
		httptest.NewRequest(http.MethodGet, "/apis/metrics.k8s.io/v1beta1/pods?watch=true", nil),
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		var status metav1.Status
		if decode(t, w, http.StatusMethodNotAllowed, &status); status.Kind != "Status" || status.Reason != metav1.StatusReasonMethodNotAllowed {
			t.Errorf("%s %s: %+v", req.Method, req.URL, status)
		}
	}
}

func notFound(t *testing.T, w *httptest.ResponseRecorder, resource, name string) {
	t.Helper()
	var status metav1.Status
	decode(t, w, http.StatusNotFound, &status)
	if status.Kind != "Status" || status.APIVersion != "v1" || status.Status != metav1.StatusFailure || status.Reason != metav1.StatusReasonNotFound || status.Code != http.StatusNotFound {
		t.Errorf("not a NotFound Status: %s", w.Body)
	}
	if resource != "" && (status.Details == nil || status.Details.Group != "metrics.k8s.io" || status.Details.Kind != resource || status.Details.Name != name) {
		t.Errorf("details %+v, want %s.metrics.k8s.io %q", status.Details, resource, name)
	}
}

func nodeNames(l metricsv1beta1.NodeMetricsList) []string {
	var out []string
	for _, m := range l.Items {
		out = append(out, m.Name)
	}
	return out
}

func podNames(l metricsv1beta1.PodMetricsList) []string {
	var out []string
	for _, m := range l.Items {
		out = append(out, m.Namespace+"/"+m.Name)
	}
	return out
}
