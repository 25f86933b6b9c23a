// Package version reports what kelp is built from.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set at build time with -ldflags -X (see scripts/build.sh).
var (
	Version = "dev"
	Commit  = "unknown"
)

// String is the text of `kelp --version`: kelp's version and commit, then the
// versions of the components built in, read from the binary's module list.
func String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kelp %s (%s)\n", Version, Commit)
	mods := modules()
	for _, c := range []struct{ name, module string }{
		{"kubernetes", "k8s.io/kubernetes"},
		{"containerd", "github.com/containerd/containerd/v2"},
		{"etcd", "go.etcd.io/etcd/server/v3"},
		{"kine", "github.com/k3s-io/kine"},
	} {
		v := mods[c.module]
		if v == "" {
			v = "not built in"
		}
		fmt.Fprintf(&b, "%s %s\n", c.name, v)
	}
	fmt.Fprintf(&b, "go %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return b.String()
}

// modules maps the path of every module built in to its version
// (moduleVersion).
func modules() map[string]string {
	mods := map[string]string{}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			mods[m.Path] = moduleVersion(m)
		}
	}
	return mods
}

// patchedSuffix marks the version of a module built from kelp's patched
// copy of it.
const patchedSuffix = "+kelp"

// moduleVersion is the version m is built at: the replacement's where it
// is replaced by another version; where it is replaced by a directory,
// which Go reports as "(devel)", that is kelp's patched copy of the pinned
// version (scripts/patches.sh): the pinned version, marked patched.
func moduleVersion(m *debug.Module) string {
	switch {
	case m.Replace == nil:
		return m.Version
	case m.Replace.Version != "" && m.Replace.Version != "(devel)":
		return m.Replace.Version
	}
	return m.Version + patchedSuffix
}
