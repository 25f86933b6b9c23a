package version

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckDataDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "versions.json")
	v136 := Ran{Kelp: "v0.4.0", Kubernetes: "v1.36.3"}
	v137 := Ran{Kelp: "v0.5.0", Kubernetes: "v1.37.0"}
	read := func() string {
		data, _ := os.ReadFile(path)
		return string(data)
	}

	// A new data dir, then an upgrade: each is recorded.
	for _, now := range []Ran{v136, v137} {
		if err := CheckDataDir(path, now); err != nil {
			t.Fatalf("CheckDataDir(%v): %v", now, err)
		}
		if !strings.Contains(read(), now.Kubernetes) {
			t.Errorf("recorded %q, want %s", read(), now.Kubernetes)
		}
	}
	// Back to an older Kubernetes minor: refused, nothing changed.
	err := CheckDataDir(path, v136)
	if err == nil || !strings.Contains(err.Error(), "kelp v0.5.0 with Kubernetes v1.37.0") || !strings.Contains(err.Error(), "kelp.previous") {
		t.Fatalf("downgrade: %v", err)
	}
	if !strings.Contains(read(), "v1.37.0") {
		t.Errorf("a refused downgrade changed the record: %q", read())
	}
	// Another patch or kelp of the same minor is no downgrade.
	if err := CheckDataDir(path, Ran{Kelp: "dev", Kubernetes: "v1.37.2"}); err != nil {
		t.Errorf("same minor: %v", err)
	}
	// A record cut short by a power loss counts as none.
	if err := os.WriteFile(path, []byte(`{"kelp":"v0.9`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CheckDataDir(path, v136); err != nil {
		t.Errorf("truncated record: %v", err)
	}
}

func TestUpgrade(t *testing.T) {
	v136 := Ran{Kelp: "v0.4.0", Kubernetes: "v1.36.3"}
	for _, tc := range []struct {
		to   Ran
		want bool
	}{
		{v136, false},
		{Ran{Kelp: "v0.4.0", Kubernetes: "v1.36.9"}, false},
		{Ran{Kelp: "v0.4.0", Kubernetes: "v1.37.0"}, true},
		{Ran{Kelp: "v0.4.1", Kubernetes: "v1.36.3"}, true},
		{Ran{}, true},
	} {
		if got := Upgrade(v136, tc.to); got != tc.want {
			t.Errorf("Upgrade(%v, %v) = %v, want %v", v136, tc.to, got, tc.want)
		}
	}
}
