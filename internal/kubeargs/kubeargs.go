// Package kubeargs renders the command lines of the upstream Kubernetes
// components kelp runs in-process: kelp's defaults, then the user's
// --kube-*-arg extras, which win.
package kubeargs

import (
	"encoding/json"
	"net/netip"
	"sort"
	"strings"

	"github.com/sirupsen/logrus"
)

// WithLeaderElection adds kelp's leader election settings to the flags of
// the controller-manager or the scheduler. Without enabled (a datastore no
// second server can share, like SQLite) there is nobody to elect, and no
// lease to renew. Otherwise: upstream renews every 2 s, which costs most of
// an idle server's disk writes; kelp renews every 10 s and lets a standby
// take over after 60 s of silence. Nobody waits that long after a clean
// stop, which releases the leases; a server restarted after a crash frees
// those its previous run held.
func WithLeaderElection(flags map[string]string, enabled bool) map[string]string {
	if !enabled {
		flags["leader-elect"] = "false"
		return flags
	}
	flags["leader-elect"] = "true"
	flags["leader-elect-lease-duration"] = "60s"
	flags["leader-elect-renew-deadline"] = "40s"
	flags["leader-elect-retry-period"] = "10s"
	return flags
}

// featureGates is the one flag whose extras add to kelp's value rather
// than replace it: kelp's gates keep what kelp relies on (the
// controller-manager's release of its lease on stop, which without the gate
// exits the process), and a user's gate of the same name still wins, as
// the components take the last value of a gate.
const featureGates = "feature-gates"

// Render returns flags for an upstream component: defaults, overridden by
// the user's "name=value" extras (a later extra wins; feature-gates are
// added to), sorted by name.
func Render(defaults map[string]string, extra []string) []string {
	merged := make(map[string]string, len(defaults)+len(extra))
	for k, v := range defaults {
		merged[k] = v
	}
	for _, e := range extra {
		name, value, _ := strings.Cut(strings.TrimLeft(e, "-"), "=")
		if name == featureGates && merged[name] != "" && value != "" {
			value = merged[name] + "," + value
		}
		merged[name] = value
	}
	names := make([]string, 0, len(merged))
	for k := range merged {
		names = append(names, k)
	}
	sort.Strings(names)
	out := make([]string, 0, len(names))
	for _, k := range names {
		out = append(out, "--"+k+"="+merged[k])
	}
	return out
}

// Sets says whether extra, "name=value" flags as Render takes them,
// sets the flag name.
func Sets(extra []string, name string) bool {
	for _, e := range extra {
		if n, _, _ := strings.Cut(strings.TrimLeft(e, "-"), "="); n == name {
			return true
		}
	}
	return false
}

// Log records at Debug the command line kelp runs component with, as a JSON
// array in the field args: `kelp server --debug` shows what each upstream
// component was given, and scripts/bench-baseline.sh starts the same
// components as separate processes with exactly these.
func Log(component string, args []string) {
	line, _ := json.Marshal(args) // a []string always marshals
	logrus.WithField("component", component).WithField("args", string(line)).Debug("command line")
}

// CIDRs writes prefixes as the components' and kelp's CIDR flags take
// them: a comma list, the primary family first.
func CIDRs(prefixes []netip.Prefix) string {
	s := make([]string, len(prefixes))
	for i, p := range prefixes {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
