package metrics

import (
	"fmt"
	"io"
	"math"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one reading of a node or a container by its kubelet.
type Sample struct {
	// Time is when the kubelet took the figures: CPU rates are computed
	// between two of these, not between the times of the scrapes.
	Time time.Time
	// CPU is the CPU time used since Start, in core-seconds.
	CPU float64
	// Memory is the working set, in bytes.
	Memory float64
	// Start is when the container started (zero for a node): a container
	// that restarted has a new one, and a CPU time counted from zero.
	Start time.Time
}

// ContainerKey names a container of a pod.
type ContainerKey struct {
	Namespace, Pod, Container string
}

// Reading is what one scrape of a kubelet returned.
type Reading struct {
	// Node is the whole node; Node.Time is zero if the kubelet reported
	// no CPU or memory figure for it.
	Node Sample
	// Containers hold every container with both a CPU and a memory figure.
	Containers map[ContainerKey]Sample
}

// The metrics of the kubelet's /metrics/resource that the API is made of.
const (
	nodeCPU         = "node_cpu_usage_seconds_total"
	nodeMemory      = "node_memory_working_set_bytes"
	containerCPU    = "container_cpu_usage_seconds_total"
	containerMemory = "container_memory_working_set_bytes"
	containerStart  = "container_start_time_seconds"
)

// Parse reads a kubelet's /metrics/resource in the Prometheus text format.
// A figure without a timestamp (the kubelet sets them) counts as taken at
// scraped.
func Parse(r io.Reader, scraped time.Time) (Reading, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return Reading{}, fmt.Errorf("parse resource metrics: %w", err)
	}
	at := func(m *dto.Metric) time.Time {
		if m.TimestampMs == nil {
			return scraped
		}
		return time.UnixMilli(m.GetTimestampMs())
	}

	var out Reading
	var cpu, mem *dto.Metric
	if f := families[nodeCPU]; f != nil && len(f.Metric) > 0 {
		cpu = f.Metric[0]
	}
	if f := families[nodeMemory]; f != nil && len(f.Metric) > 0 {
		mem = f.Metric[0]
	}
	if cpu != nil && mem != nil {
		out.Node = Sample{Time: at(cpu), CPU: value(cpu), Memory: value(mem)}
	}

	type partial struct {
		cpu, mem *dto.Metric
		start    time.Time
	}
	containers := map[ContainerKey]*partial{}
	get := func(m *dto.Metric) *partial {
		k := containerKey(m)
		if k.Container == "" || k.Pod == "" || k.Namespace == "" {
			return nil
		}
		p := containers[k]
		if p == nil {
			p = &partial{}
			containers[k] = p
		}
		return p
	}
	for _, m := range families[containerCPU].GetMetric() {
		if p := get(m); p != nil {
			p.cpu = m
		}
	}
	for _, m := range families[containerMemory].GetMetric() {
		if p := get(m); p != nil {
			p.mem = m
		}
	}
	for _, m := range families[containerStart].GetMetric() {
		if p := get(m); p != nil {
			sec, frac := math.Modf(value(m))
			p.start = time.Unix(int64(sec), int64(frac*1e9))
		}
	}
	out.Containers = make(map[ContainerKey]Sample, len(containers))
	for k, p := range containers {
		if p.cpu == nil || p.mem == nil {
			continue
		}
		out.Containers[k] = Sample{Time: at(p.cpu), CPU: value(p.cpu), Memory: value(p.mem), Start: p.start}
	}
	return out, nil
}

func containerKey(m *dto.Metric) ContainerKey {
	var k ContainerKey
	for _, l := range m.GetLabel() {
		switch l.GetName() {
		case "namespace":
			k.Namespace = l.GetValue()
		case "pod":
			k.Pod = l.GetValue()
		case "container":
			k.Container = l.GetValue()
		}
	}
	return k
}

// value reads a counter or a gauge, whichever the kubelet declared.
func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetUntyped().GetValue()
}
