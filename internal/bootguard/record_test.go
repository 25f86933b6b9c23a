package bootguard

import (
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/version"
)

var (
	v1 = version.Ran{Kelp: "v0.4.0", Kubernetes: "v1.36.3"}
	v2 = version.Ran{Kelp: "v0.5.0", Kubernetes: "v1.37.2"}
	v3 = version.Ran{Kelp: "v0.6.0", Kubernetes: "v1.37.2"}
)

func TestStart(t *testing.T) {
	now := time.Date(2026, 11, 27, 2, 0, 0, 0, time.UTC)
	onTrial := func(from, to version.Ran, starts int) *Upgrade {
		return &Upgrade{From: from, To: to, Starts: starts, Began: now}
	}
	for _, tc := range []struct {
		name    string
		rec     Record
		running version.Ran
		before  *version.Ran
		limit   int
		want    *Upgrade // the upgrade on trial after the start
		due     bool
	}{
		{name: "first start", running: v1, limit: 3},
		{name: "same kelp again", rec: Record{Ready: &v1}, running: v1, limit: 3},
		{name: "same kelp, another patch of Kubernetes", rec: Record{Ready: &v1}, running: version.Ran{Kelp: "v0.4.0", Kubernetes: "v1.36.9"}, limit: 3},
		{name: "upgrade", rec: Record{Ready: &v1}, running: v2, limit: 3, want: onTrial(v1, v2, 1)},
		{name: "from a kelp without the guard", running: v2, before: &v1, limit: 3, want: onTrial(v1, v2, 1)},
		{name: "agent from a kelp without the guard", running: v2, before: &version.Ran{}, limit: 3, want: onTrial(version.Ran{}, v2, 1)},
		{name: "the guard's record wins over versions.json", rec: Record{Ready: &v2}, running: v2, before: &v1, limit: 3},
		{name: "second start", rec: Record{Ready: &v1, Upgrade: onTrial(v1, v2, 1)}, running: v2, limit: 3, want: onTrial(v1, v2, 2)},
		{name: "third start", rec: Record{Ready: &v1, Upgrade: onTrial(v1, v2, 2)}, running: v2, limit: 3, want: onTrial(v1, v2, 3)},
		{name: "the third start was killed", rec: Record{Ready: &v1, Upgrade: onTrial(v1, v2, 3)}, running: v2, limit: 3, want: onTrial(v1, v2, 3), due: true},
		{name: "never due with 0", rec: Record{Ready: &v1, Upgrade: onTrial(v1, v2, 7)}, running: v2, limit: 0, want: onTrial(v1, v2, 8)},
		{name: "another new kelp starts anew", rec: Record{Ready: &v1, Upgrade: onTrial(v1, v2, 2)}, running: v3, limit: 3, want: onTrial(v1, v3, 1)},
		{name: "back to the kelp that was ready", rec: Record{Ready: &v1, Upgrade: onTrial(v1, v2, 2)}, running: v1, limit: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, due := tc.rec.start(tc.running, tc.before, tc.limit, now)
			if due != tc.due {
				t.Errorf("due %v, want %v", due, tc.due)
			}
			a, _ := jsonOf(Record{Upgrade: got.Upgrade})
			b, _ := jsonOf(Record{Upgrade: tc.want})
			if a != b {
				t.Errorf("upgrade on trial %s, want %s", a, b)
			}
			if got.Ready != tc.rec.Ready {
				t.Errorf("a start changed the kelp that was ready: %v", got.Ready)
			}
		})
	}
}
