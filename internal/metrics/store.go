package metrics

import (
	"maps"
	"sync"
	"time"
)

// maxMissed is how many scrapes in a row a node may miss before its
// figures are dropped: one late answer must not blank `kubectl top`, but
// the HPA must not scale on figures from a node that is gone.
const maxMissed = 2

// Usage is what a node or a container used in the Window up to Time.
type Usage struct {
	Time   time.Time
	Window time.Duration
	// CPU is in cores, Memory (the working set at Time) in bytes.
	CPU, Memory float64
}

// PodUsage is the usage of a pod's containers, by container name.
type PodUsage struct {
	// Time is the newest of the containers' times, Window the widest of
	// their windows.
	Time       time.Time
	Window     time.Duration
	Containers map[string]Usage
}

// Store keeps the last reading of every node and the usage computed from
// it and the reading before; it is safe for concurrent use.
type Store struct {
	mu    sync.RWMutex
	nodes map[string]*nodeState
}

type nodeState struct {
	last   Reading
	node   *Usage              // nil until two readings
	pods   map[podKey]PodUsage // pods with at least one container's usage
	missed int                 // scrapes missed in a row
}

type podKey struct{ namespace, name string }

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{nodes: map[string]*nodeState{}}
}

// Add records a new reading of node, replacing the usage of the node and of
// its pods by the usage between it and the node's previous reading.
func (s *Store) Add(node string, r Reading) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.nodes[node]
	if st == nil {
		s.nodes[node] = &nodeState{last: r}
		return
	}
	st.missed = 0
	st.node = nil
	if u, ok := usage(st.last.Node, r.Node); ok {
		st.node = &u
	}
	st.pods = map[podKey]PodUsage{}
	for k, cur := range r.Containers {
		prev, found := st.last.Containers[k]
		if !found {
			continue
		}
		u, ok := usage(prev, cur)
		if !ok {
			continue
		}
		pk := podKey{k.Namespace, k.Pod}
		p := st.pods[pk]
		if p.Containers == nil {
			p.Containers = map[string]Usage{}
		}
		p.Containers[k.Container] = u
		if u.Time.After(p.Time) {
			p.Time = u.Time
		}
		p.Window = max(p.Window, u.Window)
		st.pods[pk] = p
	}
	st.last = r
}

// usage is what was used between two samples, if they are of the same
// run: a restarted container counts its CPU time from zero again.
func usage(prev, cur Sample) (Usage, bool) {
	window := cur.Time.Sub(prev.Time)
	if prev.Time.IsZero() || window <= 0 || cur.CPU < prev.CPU || !cur.Start.Equal(prev.Start) {
		return Usage{}, false
	}
	return Usage{
		Time:   cur.Time,
		Window: window,
		CPU:    (cur.CPU - prev.CPU) / window.Seconds(),
		Memory: cur.Memory,
	}, true
}

// Missed records that a scrape of node failed. After maxMissed in a row
// the node's figures are dropped; the next reading starts afresh.
func (s *Store) Missed(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.nodes[node]
	if st == nil {
		return
	}
	if st.missed++; st.missed >= maxMissed {
		delete(s.nodes, node)
	}
}

// Keep drops every node but those in nodes.
func (s *Store) Keep(nodes map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	maps.DeleteFunc(s.nodes, func(name string, _ *nodeState) bool { return !nodes[name] })
}

// Node returns the usage of node, if it was read twice in a row.
func (s *Store) Node(node string) (Usage, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := s.nodes[node]
	if st == nil || st.node == nil {
		return Usage{}, false
	}
	return *st.node, true
}

// Pod returns the usage of a pod's containers. A pod deleted on one node
// and made again under its name on another is briefly on both: the newer
// figures win.
func (s *Store) Pod(namespace, name string) (PodUsage, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out PodUsage
	found := false
	for _, st := range s.nodes {
		if p, ok := st.pods[podKey{namespace, name}]; ok && (!found || p.Time.After(out.Time)) {
			out, found = p, true
		}
	}
	return out, found
}
