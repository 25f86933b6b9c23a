package metrics

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func reading(at time.Time, nodeCPU float64, containers map[ContainerKey]Sample) Reading {
	return Reading{Node: Sample{Time: at, CPU: nodeCPU, Memory: 1 << 30}, Containers: containers}
}

func TestStoreRates(t *testing.T) {
	web := ContainerKey{"default", "web-1", "web"}
	sidecar := ContainerKey{"default", "web-1", "sidecar"}
	restarted := ContainerKey{"default", "crashy", "app"}
	fresh := ContainerKey{"default", "new", "app"}
	started := t0.Add(-time.Hour)

	s := NewStore()
	s.Add("node-a", reading(t0, 100, map[ContainerKey]Sample{
		web:       {Time: t0, CPU: 10, Memory: 5e6, Start: started},
		sidecar:   {Time: t0.Add(-time.Second), CPU: 1, Memory: 1e6, Start: started},
		restarted: {Time: t0, CPU: 50, Memory: 1e6, Start: started},
	}))
	if _, ok := s.Node("node-a"); ok {
		t.Error("usage after one reading: a rate needs two")
	}
	if _, ok := s.Pod("default", "web-1"); ok {
		t.Error("pod usage after one reading")
	}

	// 15 s later by the kubelet's clock; the sidecar's figures were 16 s
	// apart.
	t1 := t0.Add(15 * time.Second)
	s.Add("node-a", reading(t1, 103, map[ContainerKey]Sample{
		web:       {Time: t1, CPU: 11.5, Memory: 6e6, Start: started},
		sidecar:   {Time: t1, CPU: 1.4, Memory: 1e6, Start: started},
		restarted: {Time: t1, CPU: 0.2, Memory: 1e6, Start: t1.Add(-2 * time.Second)},
		fresh:     {Time: t1, CPU: 0.1, Memory: 1e6, Start: t1},
	}))
	n, ok := s.Node("node-a")
	if !ok || !near(n.CPU, 0.2) || n.Window != 15*time.Second || !n.Time.Equal(t1) || n.Memory != 1<<30 {
		t.Errorf("node usage %+v, want 0.2 cores over 15 s at t1", n)
	}
	p, ok := s.Pod("default", "web-1")
	if !ok || len(p.Containers) != 2 {
		t.Fatalf("pod usage %+v, want two containers", p)
	}
	if c := p.Containers["web"]; !near(c.CPU, 0.1) || c.Memory != 6e6 {
		t.Errorf("web %+v, want 0.1 cores and the newest working set", c)
	}
	if c := p.Containers["sidecar"]; !near(c.CPU, 0.4/16) || c.Window != 16*time.Second {
		t.Errorf("sidecar %+v, want the rate over its own 16 s", c)
	}
	if p.Window != 16*time.Second || !p.Time.Equal(t1) {
		t.Errorf("pod window %s at %s, want the widest (16 s) at the newest time", p.Window, p.Time)
	}
	if _, ok := s.Pod("default", "crashy"); ok {
		t.Error("a restarted container got a rate across its restart")
	}
	if _, ok := s.Pod("default", "new"); ok {
		t.Error("a container seen once got a rate")
	}

	// A counter that went back (or a clock that did) gives no rate.
	t2 := t1.Add(15 * time.Second)
	s.Add("node-a", reading(t2, 90, nil))
	if _, ok := s.Node("node-a"); ok {
		t.Error("a node CPU counter that went back gave a rate")
	}
	if _, ok := s.Pod("default", "web-1"); ok {
		t.Error("a pod the node no longer reports is still there")
	}
}

func TestStoreMissedAndKeep(t *testing.T) {
	s := NewStore()
	for _, name := range []string{"a", "b"} {
		s.Add(name, reading(t0, 1, nil))
		s.Add(name, reading(t0.Add(15*time.Second), 2, nil))
	}
	s.Missed("a")
	if _, ok := s.Node("a"); !ok {
		t.Error("one missed scrape dropped the node's figures")
	}
	s.Missed("a")
	if _, ok := s.Node("a"); ok {
		t.Errorf("the node's figures are kept after %d missed scrapes", maxMissed)
	}
	if _, ok := s.Node("b"); !ok {
		t.Error("another node's figures were dropped")
	}
	// Back: the first reading starts afresh.
	s.Add("a", reading(t0.Add(time.Minute), 3, nil))
	if _, ok := s.Node("a"); ok {
		t.Error("a rate across the gap")
	}
	s.Keep(map[string]bool{"a": true})
	if _, ok := s.Node("b"); ok {
		t.Error("Keep left a node that is gone")
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
