package fleet

import (
	"slices"
	"strings"
)

// order lists the nodes of a rollout in the order they are upgraded:
// servers first, the one the controller runs on (self) last of them, for
// its restart ends this controller's term; then the agents. Each part is
// by name.
func order(nodes []NodeStatus, self string) []NodeStatus {
	out := slices.Clone(nodes)
	rank := func(n NodeStatus) int {
		switch {
		case n.Server && n.Name != self:
			return 0
		case n.Server:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(out, func(a, b NodeStatus) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

func inFlight(state string) bool { return state == StateDraining || state == StateUpgrading }

// next decides a step of the rollout of nodes (in order): the nodes to
// start upgrading now, and the phase. Servers go one at a time and all
// before any agent; agents up to concurrency at a time. Once a node
// failed, no other starts, and the rollout is Failed when the nodes
// under way are done.
func next(nodes []NodeStatus, concurrency int) (start []string, phase string) {
	busy, failed, done := 0, false, 0
	for _, n := range nodes {
		switch {
		case inFlight(n.State):
			busy++
		case n.State == StateFailed:
			failed = true
		case n.State == StateSucceeded:
			done++
		}
	}
	switch {
	case failed && busy == 0:
		return nil, PhaseFailed
	case failed:
		return nil, PhaseUpgrading
	case done == len(nodes):
		return nil, PhaseSucceeded
	}
	for _, n := range nodes {
		if !n.Server || n.State == StateSucceeded {
			continue
		}
		if busy == 0 && n.State == StatePending {
			return []string{n.Name}, PhaseUpgrading
		}
		return nil, PhaseUpgrading
	}
	for _, n := range nodes {
		if busy >= max(concurrency, 1) {
			break
		}
		if n.State == StatePending {
			start = append(start, n.Name)
			busy++
		}
	}
	return start, PhaseUpgrading
}
