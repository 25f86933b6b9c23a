package server_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The kelps tests upgrade to are built from this tree, each once per run
// of the package however many tests use it: a build is a link of the
// whole binary, minutes of the CPU the cluster tests need.
const (
	// nextVersion stamps the build TestUpgrade upgrades to.
	nextVersion = "v99.0.0-upgrade-test"
	// failingVersion stamps the builds that fail after an upgrade.
	failingVersion = "v99.0.0-rollback-test"
)

// edit replaces anchor, found once in file (from the repository's root),
// by with, in a build made through go build -overlay.
type edit struct{ file, anchor, with string }

var (
	// failingServer is a kelp whose server fails once its apiserver runs,
	// as a kelp whose new apiserver rejects a flag of the old one would,
	// and which no longer takes --service-node-port-range: a server
	// started with it ends before it opens the datastore.
	failingServer = []edit{
		{"server/server.go", "if err := writeKubeconfigs(e); err != nil {",
			`if err := errors.New("this build of kelp fails once its apiserver runs"); err != nil {`},
		{"internal/config/server.go", `Name: "service-node-port-range"`, `Name: "service-node-port-range-renamed"`},
	}
	// failingAgent is a kelp whose agent fails once its node runs; a
	// server runs it as it should.
	failingAgent = []edit{
		{"agent/join.go", "follower, err := clientFor(p.ProxyKubeconfig)",
			"follower, err := clientFor(p.ProxyKubeconfig)\n\terr = errors.New(\"this build of kelp fails once its node runs\")"},
	}
)

// builds holds the package's builds, in a directory TestMain removes.
var builds struct {
	sync.Mutex
	dir  string
	byID map[string]*build
}

type build struct {
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kelp-builds-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	builds.dir, builds.byID = dir, map[string]*build{}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildKelp returns kelp built from this tree, stamped version, with
// edits; the first test to ask builds it, the others wait for it.
func buildKelp(t *testing.T, version string, edits ...edit) string {
	t.Helper()
	id := version + fmt.Sprint(edits)
	builds.Lock()
	b := builds.byID[id]
	if b == nil {
		b = &build{path: filepath.Join(builds.dir, fmt.Sprintf("kelp-%d", len(builds.byID)))}
		builds.byID[id] = b
	}
	builds.Unlock()
	b.once.Do(func() { b.err = goBuild(b.path, version, edits) })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// goBuild builds kelp to out as scripts/build.sh does, with its patched
// modules (so the build cache of the binary under test serves it), and
// the edits made through an overlay.
func goBuild(out, version string, edits []edit) error {
	root, err := filepath.Abs("..")
	if err != nil {
		return err
	}
	modfile, err := exec.Command(filepath.Join(root, "scripts", "patches.sh"), filepath.Join(root, ".cache", "patched")).Output()
	if err != nil {
		return fmt.Errorf("scripts/patches.sh: %w", err)
	}
	args := []string{"build", "-modfile", strings.TrimSpace(string(modfile)), "-o", out,
		"-ldflags", "-s -w -X github.com/kelp-dev/kelp/internal/version.Version=" + version}
	if len(edits) > 0 {
		overlay, err := writeOverlay(root, out+".overlay", edits)
		if err != nil {
			return err
		}
		args = append(args, "-overlay", overlay)
	}
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	began := time.Now()
	if log, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build kelp %s with %v: %v\n%s", version, edits, err, log)
	}
	fmt.Printf("built kelp %s with %d edits in %s\n", version, len(edits), time.Since(began).Round(time.Second))
	return nil
}

// writeOverlay writes the edited files and go build's overlay of them
// into dir, and returns the overlay's path.
func writeOverlay(root, dir string, edits []edit) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	replace := map[string]string{}
	for i, e := range edits {
		src := filepath.Join(root, e.file)
		code, err := os.ReadFile(src)
		if err != nil {
			return "", err
		}
		if strings.Count(string(code), e.anchor) != 1 {
			return "", fmt.Errorf("%s has no single %q to make the failing kelp from: update the test", e.file, e.anchor)
		}
		changed := filepath.Join(dir, fmt.Sprintf("%d-%s", i, filepath.Base(e.file)))
		if err := os.WriteFile(changed, []byte(strings.Replace(string(code), e.anchor, e.with, 1)), 0o600); err != nil {
			return "", err
		}
		replace[src] = changed
	}
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": replace})
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "overlay.json")
	return path, os.WriteFile(path, overlay, 0o600)
}
