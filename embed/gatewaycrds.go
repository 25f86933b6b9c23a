package embed

import (
	stdembed "embed"
	"io/fs"
)

// gatewayCRDs are the Gateway API's standard-channel CRDs of the module
// go.mod pins, copied here by scripts/gateway-crds.sh (run by
// scripts/build.sh).
//
//go:embed gateway-crds/*.yaml
var gatewayCRDs stdembed.FS

// GatewayCRDs are the Gateway API CRDs, one YAML file each, at the root of
// the returned tree.
func GatewayCRDs() fs.FS {
	sub, _ := fs.Sub(gatewayCRDs, "gateway-crds") // fails only on an invalid path, which this is not
	return sub
}
