package gatewayconformance

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/conformance"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

const (
	// runEnv asks for TestGatewayConformance, which scripts/test.sh does
	// not run.
	runEnv = "KELP_GATEWAY_CONFORMANCE"
	// reportEnv is where the suite writes its report (YAML); the suite's
	// own -report-output flag wins, the test's temp dir is the default.
	reportEnv = "KELP_GATEWAY_CONFORMANCE_REPORT"
	// inNodeEnv marks the test binary that TestGatewayConformance runs
	// inside the node, where TestGatewayConformanceInNode runs the suite.
	inNodeEnv = "KELP_GATEWAY_CONFORMANCE_IN_NODE"

	// gatewayClass is the GatewayClass kelp serves.
	gatewayClass = "kelp"
	startTimeout = 3 * time.Minute
	// addressRange gives each Gateway an address of its own on the node's
	// network, as the suite's tests of several Gateways on one port
	// need; usableAddress is one of it and unusableAddress not, for
	// GatewayStaticAddresses.
	addressRange    = "10.99.0.192-10.99.0.254"
	usableAddress   = "10.99.0.254"
	unusableAddress = "10.99.0.1"
	// acceptTimeout is how long a started node may take to accept its
	// GatewayClass, CRDs installed.
	acceptTimeout = 2 * time.Minute
)

// imageSources are the Go programs packed as the images the suite's
// manifests name, by repository: no registry is reachable, so the echo
// server is built from the suite's own module, at the suite's version,
// under each tag the manifests use.
var imageSources = map[string]struct{ pkg, path string }{
	"registry.k8s.io/gateway-api/echo-basic": {"sigs.k8s.io/gateway-api/conformance/echo-basic", "/echo-basic"},
	"registry.k8s.io/coredns/coredns":        {"./internal/testcluster/coredns", "/coredns"},
}

// TestGatewayConformance starts a kelp server with a node, loads the
// images the suite's manifests name through its airgap images directory,
// waits for the GatewayClass kelp to be Accepted and runs the upstream
// suite (profile GATEWAY-HTTP) inside the node's namespaces, where the
// suite reaches the apiserver and the Gateways' addresses as any client
// on the node would: the suite dials on its own in several places
// (HTTP/2, gRPC, WebSocket, TLS, TCP and UDP routes) that no dialer
// given to it reaches. The suite's flags (go test ... -args
// -run-test=HTTPRouteSimpleSameNamespace, -skip-tests=, -supported-features=,
// -debug ...) are passed on to it.
func TestGatewayConformance(t *testing.T) {
	if os.Getenv(runEnv) != "1" {
		t.Skip("the Gateway API conformance suite runs when asked: set " + runEnv + "=1 (scripts/test.sh and scripts/gateway-conformance.sh do)")
	}
	n := testcluster.NewNode(t)
	n.Agent = true
	images := suiteImages(t)
	for _, image := range sortedKeys(images) {
		source, ok := imageSources[repository(image)]
		if !ok {
			files := images[image]
			if namedByBase(files) {
				t.Fatalf("the suite's base manifests need image %s, which this test cannot build: add a Go program for it to imageSources", image)
			}
			t.Logf("image %s is not built (no Go program for it in imageSources): the tests of %s cannot start their pods", image, strings.Join(files, ", "))
			continue
		}
		n.AddImage(testcluster.BuildImage(t, source.pkg, source.path, image))
	}
	n.Start("--gateway-address-range", addressRange)
	n.WaitReady(startTimeout)
	n.WaitLog("kelp node is running", startTimeout)
	waitImages(t, n, images)

	c := gatewayClient(t, n)
	gwc, err := waitAccepted(c, acceptTimeout)
	if err != nil {
		// The suite checks this again and fails on it in its own words.
		t.Errorf("GatewayClass %s not Accepted %s after the node ran: %v", gatewayClass, acceptTimeout, err)
	}
	defaults := map[string]string{}
	if gwc != nil && len(gwc.Status.SupportedFeatures) == 0 && !anyFlag("supported-features", "exempt-features", "all-features", "run-test") {
		// The suite infers the features to test from the GatewayClass's
		// status, and refuses to run with none.
		core := sortedKeys(suite.GatewayHTTPConformanceProfile.CoreFeatures)
		t.Errorf("GatewayClass %s lists no supportedFeatures in its status, whence the suite infers what to test: testing the core features of GATEWAY-HTTP only (%s)", gatewayClass, strings.Join(core, ","))
		defaults["supported-features"] = strings.Join(core, ",")
	}

	report := reportPath(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-test.run=^TestGatewayConformanceInNode$", "-test.v"}
	if deadline, ok := t.Deadline(); ok {
		// The run inside ends first, so that its report is written and
		// shown here.
		args = append(args, "-test.timeout="+(time.Until(deadline)-time.Minute).Round(time.Second).String())
	}
	defaults["report-output"] = report
	defaults["usable-address"] = usableAddress
	defaults["unusable-address"] = unusableAddress
	defaults["version"] = kelpVersion(t, n)
	args = append(args, suiteArgs(defaults)...)
	run := n.Command(exe, args...)
	run.Env = append(run.Environ(), inNodeEnv+"=1", "KUBECONFIG="+n.Kubeconfig)
	logPath := filepath.Join(n.Dir, "suite.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	// The suite's own log, streamed: a run takes long enough to want to
	// see it go.
	run.Stdout = io.MultiWriter(os.Stdout, logFile)
	run.Stderr = run.Stdout
	t.Logf("running the suite in node %s: %s", n.Name, strings.Join(args, " "))
	start := time.Now()
	if err := testcluster.Spawn(run); err != nil {
		t.Fatalf("start the suite: %v", err)
	}
	runErr := run.Wait()
	t.Logf("the suite ran for %s (its log: %s)", time.Since(start).Round(time.Second), logPath)
	data, err := os.ReadFile(report)
	if err != nil {
		t.Errorf("the suite wrote no report: %v", err)
	} else {
		t.Logf("conformance report %s:\n%s", report, data)
	}
	if runErr != nil {
		t.Errorf("the suite failed (%v): its failed tests are the lines '--- FAIL' above", runErr)
		for _, args := range [][]string{
			{"get", "pods", "-A", "-o", "wide"},
			{"get", "gateways", "-A"},
			{"get", "events", "-A", "--field-selector", "type=Warning"},
		} {
			out, err := n.Kubectl(args...)
			t.Logf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestGatewayConformanceInNode is the suite, run as its docs say, inside
// the node that TestGatewayConformance started, with the flags it chose.
func TestGatewayConformanceInNode(t *testing.T) {
	if os.Getenv(inNodeEnv) == "" {
		t.Skip("run by TestGatewayConformance inside a kelp node")
	}
	conformance.RunConformance(t)
}

// suiteArgs are the flags of the suite that the run inside the node gets:
// those given to this test binary, then kelp's choices and extra (by flag
// name) for the others.
func suiteArgs(extra map[string]string) []string {
	defaults := map[string]string{
		"gateway-class":        gatewayClass,
		"conformance-profiles": string(suite.GatewayHTTPConformanceProfileName),
		"organization":         "kelp-dev",
		"project":              "kelp",
		"url":                  "https://github.com/kelp-dev/kelp",
		"contact":              "https://github.com/kelp-dev/kelp/issues",
		// The node goes with the test: what the suite made stays for
		// TestGatewayConformance to show when the suite fails.
		"cleanup-base-resources": "false",
	}
	for name, value := range extra {
		defaults[name] = value
	}
	var args []string
	flag.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "test.") {
			return
		}
		delete(defaults, f.Name)
		args = append(args, "-"+f.Name+"="+f.Value.String())
	})
	for _, name := range sortedKeys(defaults) {
		args = append(args, "-"+name+"="+defaults[name])
	}
	return args
}

// anyFlag says whether any of the flags names was given to the test
// binary.
func anyFlag(names ...string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || slices.Contains(names, f.Name) })
	return given
}

// reportPath is where the suite writes its report: -report-output if
// given, else $KELP_GATEWAY_CONFORMANCE_REPORT, else a file in the test's
// temp dir.
func reportPath(t *testing.T) string {
	var path string
	if anyFlag("report-output") {
		path = flag.Lookup("report-output").Value.String()
	}
	if path == "" {
		path = os.Getenv(reportEnv)
	}
	if path == "" {
		return filepath.Join(t.TempDir(), "report.yaml")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		t.Fatalf("report %s: %v", abs, err)
	}
	return abs
}

// imageLine is a manifest's "image:" field.
var imageLine = regexp.MustCompile(`^\s*(?:-\s+)?image:\s*"?([^"\s]+)"?\s*$`)

// suiteImages are the images named by the suite's manifests (base and
// the tests', not the mesh's), each with the files naming it.
func suiteImages(t *testing.T) map[string][]string {
	t.Helper()
	images := map[string][]string{}
	for _, dir := range []string{"base", "tests"} {
		err := fs.WalkDir(conformance.Manifests, dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
				return err
			}
			f, err := conformance.Manifests.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			lines := bufio.NewScanner(f)
			for lines.Scan() {
				if m := imageLine.FindStringSubmatch(lines.Text()); m != nil && !slices.Contains(images[m[1]], path) {
					images[m[1]] = append(images[m[1]], path)
				}
			}
			return lines.Err()
		})
		if err != nil {
			t.Fatalf("read the suite's manifests: %v", err)
		}
	}
	if len(images) == 0 {
		t.Fatal("the suite's manifests name no image: has their layout changed?")
	}
	return images
}

// namedByBase says whether files (of suiteImages) hold the base
// manifests, which every test needs.
func namedByBase(files []string) bool {
	return slices.ContainsFunc(files, func(f string) bool { return strings.HasPrefix(f, "base/") })
}

// repository is image without its tag.
func repository(image string) string {
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[:i]
	}
	return image
}

// waitImages waits until the node's container runtime lists every image
// built for the suite, imported from the airgap images directory.
func waitImages(t *testing.T, n *testcluster.Node, images map[string][]string) {
	t.Helper()
	var missing []string
	for deadline := time.Now().Add(time.Minute); ; {
		out, err := n.RunKelp(time.Minute, "crictl", "images")
		if err != nil {
			t.Fatalf("crictl images: %v\n%s", err, out)
		}
		listed := map[string]bool{}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) >= 2 {
				listed[f[0]+":"+f[1]] = true
			}
		}
		missing = missing[:0]
		for image := range images {
			if _, built := imageSources[repository(image)]; built && !listed[image] {
				missing = append(missing, image)
			}
		}
		if len(missing) == 0 {
			t.Logf("crictl images on node %s:\n%s", n.Name, out)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("images not imported from the airgap directory: %s\ncrictl images:\n%s", strings.Join(missing, ", "), out)
		}
		time.Sleep(time.Second)
	}
}

// gatewayClient is a client of the node's apiserver that knows the Gateway
// API's types.
func gatewayClient(t *testing.T, n *testcluster.Node) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := gatewayv1.Install(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(n.RestConfig(), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitAccepted waits for the GatewayClass kelp to be Accepted and returns
// it; if it is not within timeout, it returns what it saw last: the
// GatewayClass if there is one, and why it is not Accepted.
func waitAccepted(c client.Client, timeout time.Duration) (*gatewayv1.GatewayClass, error) {
	var last error
	var found *gatewayv1.GatewayClass
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		var gwc gatewayv1.GatewayClass
		if err := c.Get(ctx, types.NamespacedName{Name: gatewayClass}, &gwc); err != nil {
			last = err
			return false, nil
		}
		found = &gwc
		accepted := meta.FindStatusCondition(gwc.Status.Conditions, string(gatewayv1.GatewayClassConditionStatusAccepted))
		if accepted == nil {
			last = fmt.Errorf("controller %s has set no Accepted condition", gwc.Spec.ControllerName)
			return false, nil
		}
		if accepted.Status != "True" {
			last = fmt.Errorf("condition Accepted is %s: %s: %s", accepted.Status, accepted.Reason, accepted.Message)
			return false, nil
		}
		return true, nil
	})
	if err != nil && last != nil {
		err = last
	}
	return found, err
}

// kelpVersion is the version the node's kelp says it is, for the report.
func kelpVersion(t *testing.T, n *testcluster.Node) string {
	t.Helper()
	out, err := n.RunKelp(time.Minute, "--version")
	if err != nil {
		t.Fatalf("kelp --version: %v\n%s", err, out)
	}
	// "kelp VERSION (COMMIT)" first.
	if f := strings.Fields(out); len(f) >= 2 && f[0] == "kelp" {
		return f[1]
	}
	t.Fatalf("kelp --version: no version in %q", out)
	return ""
}

func sortedKeys[K ~string, V any](m map[K]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, string(k))
	}
	sort.Strings(keys)
	return keys
}

// TestSuiteImages checks, without a cluster, that this test builds every
// image the suite's base manifests name: a new version of the suite that
// names another one fails here first.
func TestSuiteImages(t *testing.T) {
	images := suiteImages(t)
	for image, files := range images {
		if _, ok := imageSources[repository(image)]; !ok && namedByBase(files) {
			t.Errorf("image %s of %s has no Go program in imageSources", image, strings.Join(files, ", "))
		}
	}
	for _, want := range []string{"registry.k8s.io/gateway-api/echo-basic:v1.5.1", "registry.k8s.io/coredns/coredns:v1.12.2"} {
		if _, ok := images[want]; !ok {
			t.Errorf("the suite's manifests do not name %s: found %v", want, sortedKeys(images))
		}
	}
}

func TestRepository(t *testing.T) {
	for image, want := range map[string]string{
		"registry.k8s.io/gateway-api/echo-basic:v1.5.1": "registry.k8s.io/gateway-api/echo-basic",
		"localhost:5000/echo":                           "localhost:5000/echo",
		"localhost:5000/echo:1":                         "localhost:5000/echo",
		"echo":                                          "echo",
	} {
		if got := repository(image); got != want {
			t.Errorf("repository(%q) = %q, want %q", image, got, want)
		}
	}
}
