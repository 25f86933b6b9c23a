package metrics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// fakeKubelet serves /metrics/resource with a node that used 0.5 cores
// between any two reads, 15 s apart by its clock.
func fakeKubelet(t *testing.T) *httptest.Server {
	var reads atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics/resource" {
			http.NotFound(w, r)
			return
		}
		n := reads.Add(1)
		at := t0.Add(time.Duration(n) * 15 * time.Second).UnixMilli()
		fmt.Fprintf(w, "node_cpu_usage_seconds_total %g %d\nnode_memory_working_set_bytes 1e9 %d\n", 7.5*float64(n), at, at)
		fmt.Fprintf(w, "container_cpu_usage_seconds_total{container=\"c\",namespace=\"default\",pod=\"p\"} %g %d\n", 1.5*float64(n), at)
		fmt.Fprintf(w, "container_memory_working_set_bytes{container=\"c\",namespace=\"default\",pod=\"p\"} 1e6 %d\n", at)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func kubeletNode(name, addr string, ready bool) *corev1.Node {
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			Conditions:      []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}},
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "nowhere.invalid"}, {Type: corev1.NodeInternalIP, Address: host}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(p)}},
		},
	}
}

// A node that is down or does not answer costs a scrape round at most the
// timeout, is reported once, loses its figures after maxMissed rounds,
// and leaves the other nodes' figures and the API alone.
func TestScrapeNodeDown(t *testing.T) {
	good := fakeKubelet(t)
	hung := make(chan struct{})
	slow := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hung }))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(hung) })
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downAddr := closed.Addr().String()
	closed.Close()

	nodes := []*corev1.Node{
		kubeletNode("good", good.Listener.Addr().String(), true),
		kubeletNode("slow", slow.Listener.Addr().String(), true),
		kubeletNode("down", downAddr, true),
		kubeletNode("joining", downAddr, false),
	}
	pool := x509.NewCertPool()
	pool.AddCert(good.Certificate())
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	store := NewStore()
	s := NewScraper(store, &tls.Config{RootCAs: pool}, logger)
	s.client.Timeout = 300 * time.Millisecond

	for round := 1; round <= 3; round++ {
		began := time.Now()
		s.Scrape(context.Background(), nodes)
		if took := time.Since(began); took > 2*time.Second {
			t.Errorf("round %d took %s: the reads are not parallel, or not bounded", round, took)
		}
		if round == 1 {
			// Figures of the slow node from before it hung.
			store.Add("slow", reading(t0, 1, nil))
			store.Add("slow", reading(t0.Add(15*time.Second), 2, nil))
		}
		// It missed rounds 2 and 3.
		if _, ok := store.Node("slow"); ok != (round < 1+maxMissed) {
			t.Errorf("round %d: slow node's figures kept: %v, want them until it missed %d reads", round, ok, maxMissed)
		}
	}
	u, ok := store.Node("good")
	if !ok || !near(u.CPU, 0.5) || u.Window != 15*time.Second {
		t.Errorf("good node %+v, %v: want 0.5 cores over 15 s", u, ok)
	}
	var warned []string
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel {
			warned = append(warned, fmt.Sprint(e.Data["node"]))
		}
	}
	slices.Sort(warned)
	if !slices.Equal(warned, []string{"down", "slow"}) {
		t.Errorf("warnings for %v, want one each for down and slow (none for a node not Ready yet)", warned)
	}

	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range nodes {
		_ = indexer.Add(n)
	}
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	_ = pods.Add(&metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"}})
	api := NewAPI(store, corelisters.NewNodeLister(indexer), cache.NewGenericLister(pods, corev1.Resource("pods")))
	var list metricsv1beta1.NodeMetricsList
	decode(t, get(t, api, "/apis/metrics.k8s.io/v1beta1/nodes"), http.StatusOK, &list)
	if names := nodeNames(list); !slices.Equal(names, []string{"good"}) {
		t.Errorf("nodes %v, want the good one", names)
	}
	var pod metricsv1beta1.PodMetrics
	decode(t, get(t, api, "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/p"), http.StatusOK, &pod)
	if cpu := pod.Containers[0].Usage.Cpu().MilliValue(); cpu != 100 {
		t.Errorf("pod p uses %dm, want 100m", cpu)
	}

	// The down node comes back: said once at Info, figures from its second
	// read on.
	back := fakeKubelet(t)
	nodes[2] = kubeletNode("down", back.Listener.Addr().String(), true)
	hook.Reset()
	s.Scrape(context.Background(), nodes)
	s.Scrape(context.Background(), nodes)
	if _, ok := store.Node("down"); !ok {
		t.Error("the node that came back has no figures")
	}
	var infos []string
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.InfoLevel {
			infos = append(infos, e.Message)
		}
	}
	if len(infos) != 1 || !strings.Contains(infos[0], "again") {
		t.Errorf("info logs %q, want one saying the kubelet answers again", infos)
	}
}

func TestKubeletURL(t *testing.T) {
	n := kubeletNode("n", "10.0.0.5:10250", true)
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.5"})
	if url, err := kubeletURL(n); err != nil || url != "https://10.0.0.5:10250/metrics/resource" {
		t.Errorf("%q, %v: want the internal IP first", url, err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "fd00::5"}}
	if url, _ := kubeletURL(n); url != "https://[fd00::5]:10250/metrics/resource" {
		t.Errorf("IPv6: %q", url)
	}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = 0
	if _, err := kubeletURL(n); err == nil {
		t.Error("no port, no URL")
	}
}
