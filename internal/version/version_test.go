package version

import (
	"runtime/debug"
	"testing"
)

func TestModuleVersion(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  debug.Module
		want string
	}{
		{"pinned", debug.Module{Path: "go.etcd.io/etcd/server/v3", Version: "v3.7.1"}, "v3.7.1"},
		{"replaced by a version", debug.Module{Path: "k8s.io/api", Version: "v0.0.0", Replace: &debug.Module{Path: "k8s.io/api", Version: "v0.37.2"}}, "v0.37.2"},
		{"kelp's patched copy", debug.Module{Path: "github.com/k3s-io/kine", Version: "v0.17.5", Replace: &debug.Module{Path: "/work/.cache/patched/kine", Version: "(devel)"}}, "v0.17.5+kelp"},
		{"kelp's patched copy, no version", debug.Module{Path: "github.com/k3s-io/kine", Version: "v0.17.5", Replace: &debug.Module{Path: "/work/.cache/patched/kine"}}, "v0.17.5+kelp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := moduleVersion(&tc.mod); got != tc.want {
				t.Errorf("moduleVersion = %q, want %q", got, tc.want)
			}
		})
	}
}
