package metrics

import (
	"os"
	"strings"
	"testing"
	"time"
)

// testdata/resource.txt is a kelp kubelet's /metrics/resource, taken
// while TestMetrics (server/metrics_test.go) ran.
func TestParseKubeletSample(t *testing.T) {
	f, err := os.Open("testdata/resource.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	scraped := time.Now()
	r, err := Parse(f, scraped)
	if err != nil {
		t.Fatal(err)
	}
	want := Sample{Time: time.UnixMilli(1795455323371), CPU: 23.692728054, Memory: 3.86977792e+08}
	if r.Node != want {
		t.Errorf("node %+v, want %+v", r.Node, want)
	}
	if len(r.Containers) != 4 {
		t.Errorf("%d containers, want 4: %+v", len(r.Containers), r.Containers)
	}
	sink := r.Containers[ContainerKey{"default", "sink-57bc4d9d58-bh9nj", "sink"}]
	if sink.CPU != 4.47513056 || sink.Memory != 1.92512e+06 || !sink.Time.Equal(time.UnixMilli(1795455331804)) {
		t.Errorf("sink container %+v", sink)
	}
	if got := sink.Start.Sub(time.Unix(1795455277, 56333500)); got < -time.Microsecond || got > time.Microsecond {
		t.Errorf("sink started at %s, want 1795455277.0563335", sink.Start)
	}
}

func TestParseEdges(t *testing.T) {
	scraped := time.Unix(1700000000, 0)
	r, err := Parse(strings.NewReader(`# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 10
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 2048
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container="a",namespace="ns",pod="p"} 1
container_cpu_usage_seconds_total{container="only-cpu",namespace="ns",pod="p"} 1
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container="a",namespace="ns",pod="p"} 100
`), scraped)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Node.Time.Equal(scraped) || r.Node.CPU != 10 || r.Node.Memory != 2048 {
		t.Errorf("node %+v: without timestamps, figures count as taken when scraped", r.Node)
	}
	if len(r.Containers) != 1 || r.Containers[ContainerKey{"ns", "p", "a"}].Memory != 100 {
		t.Errorf("containers %+v: want only the one with both figures", r.Containers)
	}

	// A kubelet that could not read its node reports no node figures.
	r, err = Parse(strings.NewReader("resource_scrape_error 1\n"), scraped)
	if err != nil || !r.Node.Time.IsZero() || len(r.Containers) != 0 {
		t.Errorf("empty reading: %+v, %v", r, err)
	}
	if _, err := Parse(strings.NewReader("node_cpu_usage_seconds_total{ 1\n"), scraped); err == nil {
		t.Error("garbage parsed")
	}
}
