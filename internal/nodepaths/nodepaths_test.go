package nodepaths

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kelp-dev/kelp/internal/layout"
)

func TestDerive(t *testing.T) {
	if got := Derive("/var/lib/kelp/"); got != (Paths{CgroupRoot: "/", PodLogsDir: "/var/log/pods"}) {
		t.Errorf("the default data dir: %+v, want the machine's kubepods and /var/log/pods", got)
	}
	a, b := Derive("/srv/a"), Derive("/srv/b")
	if a.CgroupRoot == b.CgroupRoot || a.CgroupRoot == "/" || a.PodLogsDir != "/srv/a/agent/pod-logs" {
		t.Errorf("two data dirs: %+v and %+v, want cgroup roots and pod log dirs of their own", a, b)
	}
	if err := a.validate(); err != nil {
		t.Errorf("a derived root is invalid: %v", err)
	}
	if a != Derive("/srv//a") {
		t.Error("two spellings of one data dir derive different paths")
	}
}

func TestEnsure(t *testing.T) {
	dir := t.TempDir()
	p, kept, err := Ensure(dir)
	if err != nil || kept || p != Derive(dir) {
		t.Fatalf("a new node: %+v kept %v, %v; want %+v", p, kept, err, Derive(dir))
	}
	// The record wins over what a later kelp would derive.
	recorded := Paths{CgroupRoot: "/kelp_aaaaaaaaaaaa", PodLogsDir: "/srv/logs"}
	if err := os.WriteFile(layout.Agent(dir).NodePaths, []byte(`{"cgroupRoot":"/kelp_aaaaaaaaaaaa","podLogsDir":"/srv/logs"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if p, _, err := Ensure(dir); err != nil || p != recorded {
		t.Errorf("recorded: %+v, %v; want %+v", p, err, recorded)
	}
	if p, err := Load(dir); err != nil || p != recorded {
		t.Errorf("Load: %+v, %v; want %+v", p, err, recorded)
	}

	// A node that ran before kelp recorded its paths keeps the machine's.
	old := t.TempDir()
	if err := os.MkdirAll(filepath.Dir(layout.Agent(old).KubeletConfig), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(layout.Agent(old).KubeletConfig, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if p, err := Load(old); err != nil || p != Derive(old) {
		t.Errorf("Load before the record: %+v, %v", p, err)
	}
	if p, kept, err := Ensure(old); err != nil || !kept || p != Legacy() {
		t.Errorf("a node of an earlier kelp: %+v kept %v, %v; want %+v", p, kept, err, Legacy())
	}
	if p, err := Load(old); err != nil || p != Legacy() {
		t.Errorf("Load after: %+v, %v; want the record, %+v", p, err, Legacy())
	}
}

func TestBadRecord(t *testing.T) {
	for _, record := range []string{
		`not json`,
		`{"cgroupRoot":"kelp","podLogsDir":"/var/log/pods"}`,
		`{"cgroupRoot":"/a/b","podLogsDir":"/var/log/pods"}`,
		`{"cgroupRoot":"/kelp-a","podLogsDir":"/var/log/pods"}`,
		`{"cgroupRoot":"/","podLogsDir":"/"}`,
		`{"cgroupRoot":"/","podLogsDir":"logs"}`,
		`{}`,
	} {
		dir := t.TempDir()
		if err := os.MkdirAll(layout.Agent(dir).Dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(layout.Agent(dir).NodePaths, []byte(record), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Ensure(dir); err == nil || !strings.Contains(err.Error(), layout.Agent(dir).NodePaths) || !strings.Contains(err.Error(), "remove it") {
			t.Errorf("record %s: error %v, want one naming the file and what to do", record, err)
		}
	}
}

func TestPodCgroups(t *testing.T) {
	if got := PodCgroups("/"); !slices.Equal(got, []string{"kubepods", "kubepods.slice"}) {
		t.Errorf("PodCgroups(/) = %q", got)
	}
	if got := PodCgroups("/kelp_0123456789ab"); !slices.Equal(got, []string{"kelp_0123456789ab", "kelp_0123456789ab.slice"}) {
		t.Errorf("PodCgroups(/kelp_0123456789ab) = %q", got)
	}
}
