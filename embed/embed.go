// Package embed carries the runtime binaries kelp does not run itself
// (containerd and its shim, runc, the CNI reference plugins) and the pause
// image, and stages them on disk once per bundle version.
//
// The bundle is built by scripts/bundle.sh from modules pinned in
// scripts/bundle/go.mod and is never committed: run the script before
// building kelp.
package embed

import (
	"bytes"
	_ "embed" // for the go:embed directives below
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
)

// PauseImage is the name the bundled pause image is imported under; the
// kubelet's and containerd's sandbox image must be set to it.
// scripts/bundle.sh builds the image with the same name.
const PauseImage = "docker.io/kelp-dev/pause:1.0.0"

//go:embed bundle.tar.zst
var bundleArchive []byte

//go:embed bundle.sha256
var bundleSum string

// Staged says where a staged bundle lives.
type Staged struct {
	// Dir is <data-dir>/data/<hash>; it never changes while its bundle is in use.
	Dir string
	// BinDir holds containerd, containerd-shim-runc-v2, runc and the CNI
	// plugins (bridge, host-local, loopback, bandwidth); put it on PATH and
	// use it as the CNI bin dir.
	BinDir string
	// PauseImage is the name of the image in PauseImageTar.
	PauseImage string
	// PauseImageTar is an OCI image layout tarball for containerd to import.
	PauseImageTar string
}

// Stage makes the embedded bundle available under <dataDir>/data/<hash>/ and
// returns where its pieces are. The first call for a bundle extracts and
// verifies it; later calls only check that it is there.
func Stage(dataDir string) (Staged, error) {
	hash, err := parseSum(bundleSum)
	if err != nil {
		return Staged{}, fmt.Errorf("embedded bundle.sha256: %w", err)
	}
	return stage(dataDir, hash, bytes.NewReader(bundleArchive))
}

// parseSum reads the hash from a sha256sum line ("<hex>  bundle.tar.zst").
func parseSum(line string) (string, error) {
	fields := strings.Fields(line)
	if len(fields) == 0 || !isHash(fields[0]) {
		return "", fmt.Errorf("want a sha256 hex digest, got %q", line)
	}
	return fields[0], nil
}

func isHash(s string) bool {
	if len(s) != 64 || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func stagedAt(dir string) Staged {
	return Staged{
		Dir:           dir,
		BinDir:        filepath.Join(dir, "bin"),
		PauseImage:    PauseImage,
		PauseImageTar: filepath.Join(dir, "images", "pause.tar"),
	}
}
