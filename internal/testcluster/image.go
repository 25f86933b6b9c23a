package testcluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/kelp-dev/kelp/internal/layout"
)

// TestImage is the name tests give the image BuildTestImage makes.
const TestImage = "docker.io/kelp-test/testapp:1.0"

// builtImages are the image tarballs BuildImage made, by image name: the
// tests of one test binary, also those running in parallel, build each once
// and get a copy each.
var builtImages = struct {
	sync.Mutex
	tars map[string][]byte
}{tars: map[string][]byte{}}

// BuildTestImage packs testapp (see testapp/main.go) into an OCI image
// tarball named name with the bundle's own image tool, and returns its
// path, in a temp dir of t: tests drop it into a node's airgap images
// directory, as no registry is reachable.
func BuildTestImage(t *testing.T, name string) string {
	t.Helper()
	return BuildImage(t, "./internal/testcluster/testapp", "/testapp", name)
}

// BuildImage builds the Go main package pkg (a path in kelp's module, such
// as ./internal/testcluster/testapp, or an import path of a module kelp
// requires), static, and packs it into an OCI image tarball named name
// whose one file and entrypoint is path. It returns the tarball's path, in
// a temp dir of t; a name built before in the test binary is not built
// again.
func BuildImage(t *testing.T, pkg, path, name string) string {
	t.Helper()
	builtImages.Lock()
	defer builtImages.Unlock()
	data, ok := builtImages.tars[name]
	if !ok {
		var err error
		if data, err = os.ReadFile(buildImage(t, pkg, path, name)); err != nil {
			t.Fatal(err)
		}
		builtImages.tars[name] = data
	}
	tar := filepath.Join(t.TempDir(), imageFile(name))
	if err := os.WriteFile(tar, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return tar
}

// imageFile is the name of the tarball of the image name: testapp.tar for
// TestImage, as before there were other images; the name made safe for a
// file otherwise, so that the images of one node have tarballs of their
// own in its airgap directory.
func imageFile(name string) string {
	if name == TestImage {
		return "testapp.tar"
	}
	return strings.NewReplacer("/", "_", ":", "_").Replace(name) + ".tar"
}

// buildImage builds the image tarball of BuildImage and returns its path.
func buildImage(t *testing.T, pkg, path, name string) string {
	t.Helper()
	bin := buildPackage(t, pkg)
	tar := filepath.Join(filepath.Dir(bin), "image.tar")
	pack := exec.Command("go", "run", "./mkimage", "-binary", bin, "-path", path, "-name", name, "-arch", runtime.GOARCH, "-out", tar)
	pack.Dir = filepath.Join(Repository(t), "scripts", "bundle")
	if out, err := pack.CombinedOutput(); err != nil {
		t.Fatalf("pack image %s: %v\n%s", name, err, out)
	}
	return tar
}

// BuildCommand builds one of the test commands beside this package
// (testapp, csidriver), static, and returns its path in a temp dir of t.
func BuildCommand(t *testing.T, name string) string {
	t.Helper()
	return buildPackage(t, "./internal/testcluster/"+name)
}

// buildPackage builds the main package pkg of kelp's module graph, static,
// and returns its path in a temp dir of t.
func buildPackage(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	build := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
	build.Dir = Repository(t)
	build.Env = append(build.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// Repository is the directory of kelp's source.
func Repository(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("find the repository: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// AddImage puts the image tarball at tar into the node's airgap images
// directory, where kelp imports it when it starts.
func (n *Node) AddImage(tar string) {
	n.t.Helper()
	dir := layout.Agent(n.DataDir).ImagesDir
	data, err := os.ReadFile(tar)
	if err == nil {
		err = os.MkdirAll(dir, 0o700)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, filepath.Base(tar)), data, 0o600)
	}
	if err != nil {
		n.t.Fatalf("add image %s to node %s: %v", tar, n.Name, err)
	}
}
