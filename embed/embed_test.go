package embed

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestParseSum(t *testing.T) {
	hash := strings.Repeat("0a", 32)
	tests := []struct {
		line    string
		want    string
		wantErr bool
	}{
		{line: hash + "  bundle.tar.zst\n", want: hash},
		{line: hash + "\n", want: hash},
		{line: "", wantErr: true},
		{line: strings.ToUpper(hash), wantErr: true},
		{line: "xyz  bundle.tar.zst", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseSum(tt.line)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseSum(%q) = %q, %v; want %q, error %v", tt.line, got, err, tt.want, tt.wantErr)
		}
	}
}

// TestStageEmbeddedBundle checks the bundle scripts/bundle.sh built.
func TestStageEmbeddedBundle(t *testing.T) {
	staged, err := Stage(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{"containerd", "containerd-shim-runc-v2", "runc", "bridge", "host-local", "loopback", "bandwidth"} {
		fi, err := os.Stat(filepath.Join(staged.BinDir, bin))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o111 == 0 {
			t.Errorf("%s is not executable: %v", bin, fi.Mode())
		}
	}

	checkContainerd(t, filepath.Join(staged.BinDir, "containerd"))

	index, config := readPauseImage(t, staged.PauseImageTar)
	if len(index.Manifests) != 1 {
		t.Fatalf("pause image index has %d manifests, want 1", len(index.Manifests))
	}
	if name := index.Manifests[0].Annotations["io.containerd.image.name"]; name != PauseImage {
		t.Errorf("pause image is named %q, embed.PauseImage is %q: keep scripts/bundle.sh and PauseImage in step", name, PauseImage)
	}
	if got := config.Config.Entrypoint; len(got) != 1 || got[0] != "/pause" {
		t.Errorf("pause image entrypoint = %q, want [/pause]", got)
	}
}

// checkContainerd runs the bundle's containerd: it has kelp's plugins, not
// upstream's full set.
func checkContainerd(t *testing.T, bin string) {
	t.Helper()
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "containerd github.com/containerd/containerd/v2 v2.") {
		t.Fatalf("containerd --version: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "--config", os.DevNull, "config", "default").CombinedOutput()
	if err != nil {
		t.Fatalf("containerd config default: %v\n%s", err, out)
	}
	for _, plugin := range []string{"io.containerd.cri.v1.runtime", "io.containerd.snapshotter.v1.overlayfs"} {
		if !strings.Contains(string(out), plugin) {
			t.Errorf("the bundle's containerd lacks plugin %s", plugin)
		}
	}
	for _, plugin := range []string{"io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs", "io.containerd.snapshotter.v1.blockfile"} {
		if strings.Contains(string(out), plugin) {
			t.Errorf("the bundle's containerd has plugin %s, which kelp leaves out (scripts/bundle/containerd)", plugin)
		}
	}
}

// readPauseImage returns the index and the image config of an OCI layout tarball.
func readPauseImage(t *testing.T, path string) (ocispec.Index, ocispec.Image) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		blobs[hdr.Name] = data
	}
	var index ocispec.Index
	if err := json.Unmarshal(blobs["index.json"], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if len(index.Manifests) == 0 {
		t.Fatal("index.json lists no manifest")
	}
	var manifest ocispec.Manifest
	if err := json.Unmarshal(blobs["blobs/sha256/"+index.Manifests[0].Digest.Encoded()], &manifest); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	var config ocispec.Image
	if err := json.Unmarshal(blobs["blobs/sha256/"+manifest.Config.Digest.Encoded()], &config); err != nil {
		t.Fatalf("config: %v", err)
	}
	return index, config
}
