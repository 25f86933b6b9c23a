package embed

import (
	stdembed "embed"
	"io/fs"
)

// manifests are kelp's built-in manifests: text/template files that
// internal/addons renders into the manifests directory at every start.
//
//go:embed manifests/*.yaml
var manifests stdembed.FS

// Manifests are the built-in manifests, one NAME.yaml per part that
// --disable NAME turns off, at the root of the returned tree.
func Manifests() fs.FS {
	sub, _ := fs.Sub(manifests, "manifests") // fails only on an invalid path, which this is not
	return sub
}
