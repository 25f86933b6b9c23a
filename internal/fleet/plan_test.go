package fleet

import (
	"slices"
	"strings"
	"testing"
)

func nodes(spec ...string) []NodeStatus {
	var out []NodeStatus
	for _, s := range spec {
		// "s:name=State" is a server, "a:name=State" an agent.
		n := NodeStatus{Server: s[0] == 's', Name: s[2:], State: StatePending}
		if i := slices.Index([]byte(s), '='); i > 0 {
			n.Name, n.State = s[2:i], s[i+1:]
		}
		out = append(out, n)
	}
	return out
}

func TestOrder(t *testing.T) {
	got := order(nodes("a:b", "s:self", "a:a", "s:z", "s:m"), "self")
	var names []string
	for _, n := range got {
		names = append(names, n.Name)
	}
	if want := []string{"m", "z", "self", "a", "b"}; !slices.Equal(names, want) {
		t.Errorf("order = %v, want %v: servers, this server last of them, then agents", names, want)
	}
}

func TestNext(t *testing.T) {
	for _, tc := range []struct {
		name        string
		nodes       []NodeStatus
		concurrency int
		start       []string
		phase       string
	}{
		{"first server", nodes("s:s1", "s:s2", "a:a1"), 3, []string{"s1"}, PhaseUpgrading},
		{"one server at a time", nodes("s:s1=Upgrading", "s:s2", "a:a1"), 3, nil, PhaseUpgrading},
		{"next server", nodes("s:s1=Succeeded", "s:s2", "a:a1"), 3, []string{"s2"}, PhaseUpgrading},
		{"agents wait for the servers", nodes("s:s1=Succeeded", "s:s2=Draining", "a:a1"), 3, nil, PhaseUpgrading},
		{"agents by concurrency", nodes("s:s1=Succeeded", "a:a1", "a:a2", "a:a3"), 2, []string{"a1", "a2"}, PhaseUpgrading},
		{"a free slot", nodes("s:s1=Succeeded", "a:a1=Succeeded", "a:a2=Upgrading", "a:a3", "a:a4"), 2, []string{"a3"}, PhaseUpgrading},
		{"no free slot", nodes("a:a1=Draining", "a:a2=Upgrading", "a:a3"), 2, nil, PhaseUpgrading},
		{"concurrency 0 is 1", nodes("a:a1", "a:a2"), 0, []string{"a1"}, PhaseUpgrading},
		{"a failure stops the rollout", nodes("s:s1=Succeeded", "a:a1=Failed", "a:a2"), 2, nil, PhaseFailed},
		{"a failed server stops the agents", nodes("s:s1=Failed", "s:s2", "a:a1"), 2, nil, PhaseFailed},
		{"a failure waits for the nodes under way", nodes("a:a1=Failed", "a:a2=Upgrading", "a:a3"), 3, nil, PhaseUpgrading},
		{"all done", nodes("s:s1=Succeeded", "a:a1=Succeeded"), 1, nil, PhaseSucceeded},
		{"agents only", nodes("a:a1", "a:a2"), 1, []string{"a1"}, PhaseUpgrading},
	} {
		start, phase := next(tc.nodes, tc.concurrency)
		if !slices.Equal(start, tc.start) || phase != tc.phase {
			t.Errorf("%s: next = %v, %s; want %v, %s", tc.name, start, phase, tc.start, tc.phase)
		}
	}
}

func TestValidate(t *testing.T) {
	sha := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		spec Spec
		bad  string
	}{
		{Spec{SHA256: sha, Path: "kelp-v2"}, ""},
		{Spec{SHA256: sha, URL: "https://example.com/kelp"}, ""},
		{Spec{SHA256: "abc", Path: "kelp"}, "not a sha256"},
		{Spec{SHA256: sha}, "give the new kelp's spec.url"},
		{Spec{SHA256: sha, Path: "kelp", URL: "http://x/kelp"}, "not both"},
		{Spec{SHA256: sha, URL: "ftp://x/kelp"}, "not an https URL"},
		{Spec{SHA256: sha, URL: "http://x/kelp"}, "allowHTTP: true"},
		{Spec{SHA256: sha, URL: "HTTP://x/kelp"}, "allowHTTP: true"},
		{Spec{SHA256: sha, URL: "http://x/kelp", AllowHTTP: true}, ""},
		{Spec{SHA256: sha, URL: "https://x/kelp", MaxSize: "lots"}, "not a size"},
		{Spec{SHA256: sha, URL: "https://x/kelp", MaxSize: "0"}, "not a size"},
		{Spec{SHA256: sha, Path: "sub/kelp"}, "neither a file name"},
		{Spec{SHA256: sha, Path: "kelp", DrainTimeout: "soon"}, "not a duration"},
		{Spec{SHA256: sha, Path: "kelp", Concurrency: -1}, "give 1 or more"},
	} {
		got, err := tc.spec.Validate()
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%+v: %v", tc.spec, err)
		case tc.bad == "" && (got.Concurrency != 1 || got.drainTimeout() != defaultDrainTimeout || got.maxSize() != 512<<20):
			t.Errorf("%+v: defaults not filled in: %+v", tc.spec, got)
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("%+v: %v, want an error with %q", tc.spec, err, tc.bad)
		}
	}
}

func TestResolvePath(t *testing.T) {
	dir := "/var/lib/kelp/agent/upgrades"
	for path, want := range map[string]string{
		"kelp-v2":                              "/var/lib/kelp/agent/upgrades/kelp-v2",
		"/var/lib/kelp/agent/upgrades/kelp-v2": "/var/lib/kelp/agent/upgrades/kelp-v2",
		"/var/lib/kelp/agent/upgrades/../kelp": "",
		"/usr/local/bin/kelp":                  "",
		"/var/lib/kelp/agent/upgrades":         "",
	} {
		got, err := ResolvePath(dir, path)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("ResolvePath(%s) = %q, %v; want %q", path, got, err, want)
		}
	}
}
