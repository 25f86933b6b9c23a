package server_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/repo"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/helmchart"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// helmTestNS is where TestHelm's releases go; the controller creates it.
const helmTestNS = "helm-test"

// demoChartTemplate is the one template of TestHelm's chart: a ConfigMap
// named for the release, holding the values.
const demoChartTemplate = `apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}
data:
  greeting: {{ required "greeting is required" .Values.greeting | quote }}
  count: {{ .Values.count | quote }}
  chartVersion: {{ .Chart.Version | quote }}
`

// TestHelm runs a server without a node and installs charts through
// HelmChart objects: from spec.chartContent (installed, upgraded by new
// values, uninstalled by deleting the HelmChart), from a chart repository
// served inside the node, and from the static charts directory; a chart
// that does not exist and values that do not render are reported in
// their status while the others install. Once all is done, nothing is
// written any more.
func TestHelm(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	charts := t.TempDir()
	for _, v := range []string{"0.1.0", "0.2.0"} {
		packageDemoChart(t, v, charts)
	}
	index, err := repo.IndexDirectory(charts, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := index.WriteFile(filepath.Join(charts, "index.yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	// On the node's address: kelp refuses loopback repositories
	// (--helm-allow-local-repos), as "loopback" below checks.
	l, err := n.Listen("tcp", testcluster.NodeIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(charts)), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	repoURL := "http://" + l.Addr().String()

	static := layout.Server(n.DataDir).StaticCharts
	if err := os.MkdirAll(static, 0o700); err != nil {
		t.Fatal(err)
	}
	archive, err := os.ReadFile(filepath.Join(charts, "demo-0.1.0.tgz"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(static, "demo.tgz"), archive, 0o600); err != nil {
		t.Fatal(err)
	}

	n.Start()
	n.WaitReady(startTimeout)
	c := n.Client()
	dyn, err := dynamic.NewForConfig(n.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	waitHelmCRD(t, n)
	content := base64.StdEncoding.EncodeToString(archive)
	for name, spec := range map[string]map[string]any{
		"content":  {"chartContent": content, "valuesContent": "greeting: from content\n", "set": map[string]any{"count": 2}},
		"repo":     {"chart": "demo", "repo": repoURL, "version": "0.2.0", "set": map[string]any{"greeting": "from a repo"}},
		"static":   {"chart": "https://%{KUBERNETES_API}%/static/charts/demo.tgz", "valuesContent": "greeting: from the static dir\n"},
		"missing":  {"chart": "nope", "repo": repoURL},
		"loopback": {"chart": "demo", "repo": "http://127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)},
		"unset":    {"chartContent": content, "valuesContent": "greeting: null\n"},
		"invalid":  {"chartContent": content, "valuesContent": "greeting: [unclosed\n"},
	} {
		spec["targetNamespace"], spec["createNamespace"] = helmTestNS, true
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
			"metadata": map[string]any{"name": name, "namespace": metav1.NamespaceSystem},
			"spec":     spec,
		}}
		must(t, "HelmChart "+name, func() error {
			_, err := dyn.Resource(helmchart.Resource).Namespace(metav1.NamespaceSystem).Create(context.Background(), obj, metav1.CreateOptions{})
			return err
		})
	}

	waitConfigMap(t, c, "content", map[string]string{"greeting": "from content", "count": "2", "chartVersion": "0.1.0"})
	waitConfigMap(t, c, "repo", map[string]string{"greeting": "from a repo", "chartVersion": "0.2.0"})
	waitConfigMap(t, c, "static", map[string]string{"greeting": "from the static dir", "chartVersion": "0.1.0"})
	waitDeployed(t, dyn, "content", metav1.ConditionTrue, helmchart.ReasonInstalled, "revision 1")
	waitDeployed(t, dyn, "repo", metav1.ConditionTrue, helmchart.ReasonInstalled, "chart demo 0.2.0")
	waitDeployed(t, dyn, "missing", metav1.ConditionFalse, helmchart.ReasonChartUnavailable, `chart "nope" not found in repository`)
	waitDeployed(t, dyn, "loopback", metav1.ConditionFalse, helmchart.ReasonChartUnavailable, "which HelmCharts may not fetch from")
	waitDeployed(t, dyn, "unset", metav1.ConditionFalse, helmchart.ReasonInstallFailed, "greeting is required")
	waitDeployed(t, dyn, "invalid", metav1.ConditionFalse, helmchart.ReasonValuesInvalid, "spec.valuesContent")

	// New values upgrade the release.
	patch := `{"spec":{"valuesContent":"greeting: upgraded\n"}}`
	must(t, "new values", func() error {
		_, err := dyn.Resource(helmchart.Resource).Namespace(metav1.NamespaceSystem).Patch(context.Background(), "content", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	})
	waitConfigMap(t, c, "content", map[string]string{"greeting": "upgraded", "count": "2"})
	waitDeployed(t, dyn, "content", metav1.ConditionTrue, helmchart.ReasonUpgraded, "revision 2")

	// Settled, the controller writes nothing: not for the deployed
	// charts, and not for the failed ones it retries.
	before := helmChartVersions(t, dyn)
	time.Sleep(12 * time.Second)
	if after := helmChartVersions(t, dyn); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("HelmCharts written while nothing changed:\nbefore %v\nafter  %v", before, after)
	}

	// Deleting a HelmChart uninstalls its release first.
	must(t, "delete HelmChart content", func() error {
		return dyn.Resource(helmchart.Resource).Namespace(metav1.NamespaceSystem).Delete(context.Background(), "content", metav1.DeleteOptions{})
	})
	testcluster.Eventually(t, "HelmChart content and its ConfigMap gone", func() (bool, error) {
		_, errCM := c.CoreV1().ConfigMaps(helmTestNS).Get(context.Background(), "content", metav1.GetOptions{})
		_, errHC := dyn.Resource(helmchart.Resource).Namespace(metav1.NamespaceSystem).Get(context.Background(), "content", metav1.GetOptions{})
		return apierrors.IsNotFound(errCM) && apierrors.IsNotFound(errHC), nil
	})
	secrets, err := c.CoreV1().Secrets(helmTestNS).List(context.Background(), metav1.ListOptions{LabelSelector: "owner=helm,name=content"})
	if err != nil || len(secrets.Items) != 0 {
		t.Errorf("release content still recorded after uninstall: %v %v", secrets, err)
	}
	waitConfigMap(t, c, "repo", map[string]string{"greeting": "from a repo"})
	if !n.Logged("release uninstalled") {
		t.Error("the uninstall is not logged")
	}
}

// waitHelmCRD waits for the HelmChart API, which kelp applies from its
// built-in manifest helm-controller.yaml.
func waitHelmCRD(t *testing.T, n *testcluster.Node) {
	t.Helper()
	testcluster.Eventually(t, "HelmChart API served", func() (bool, error) {
		_, err := n.Client().Discovery().ServerResourcesForGroupVersion(helmchart.Resource.GroupVersion().String())
		return err == nil, nil
	})
}

// packageDemoChart writes demo-VERSION.tgz into dir.
func packageDemoChart(t *testing.T, version, dir string) {
	t.Helper()
	ch := &chart.Chart{
		Metadata:  &chart.Metadata{APIVersion: chart.APIVersionV2, Name: "demo", Version: version, AppVersion: version},
		Templates: []*chart.File{{Name: "templates/configmap.yaml", Data: []byte(demoChartTemplate)}},
		Values:    map[string]any{"greeting": "hello", "count": 1},
	}
	if _, err := chartutil.Save(ch, dir); err != nil {
		t.Fatal(err)
	}
}

// waitConfigMap waits for the ConfigMap of release name to hold want.
func waitConfigMap(t *testing.T, c kubernetes.Interface, name string, want map[string]string) {
	t.Helper()
	testcluster.Eventually(t, fmt.Sprintf("ConfigMap %s/%s holds %v", helmTestNS, name, want), func() (bool, error) {
		cm, err := c.CoreV1().ConfigMaps(helmTestNS).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for k, v := range want {
			if cm.Data[k] != v {
				return false, fmt.Errorf("it holds %v", cm.Data)
			}
		}
		return true, nil
	})
}

// waitDeployed waits for HelmChart name's Deployed condition to be status
// with reason and a message that has message in it.
func waitDeployed(t *testing.T, dyn dynamic.Interface, name string, status metav1.ConditionStatus, reason, message string) {
	t.Helper()
	testcluster.Eventually(t, fmt.Sprintf("HelmChart %s Deployed %s, %s, with %q", name, status, reason, message), func() (bool, error) {
		obj, err := dyn.Resource(helmchart.Resource).Namespace(metav1.NamespaceSystem).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
		for _, c := range conds {
			c, _ := c.(map[string]any)
			if c["type"] == helmchart.ConditionDeployed && c["status"] == string(status) && c["reason"] == reason && strings.Contains(fmt.Sprint(c["message"]), message) {
				return true, nil
			}
		}
		return false, fmt.Errorf("conditions %v", conds)
	})
}

// helmChartVersions are the resourceVersions of the HelmCharts by name.
func helmChartVersions(t *testing.T, dyn dynamic.Interface) map[string]string {
	t.Helper()
	list, err := dyn.Resource(helmchart.Resource).Namespace(metav1.NamespaceSystem).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	versions := map[string]string{}
	for _, obj := range list.Items {
		versions[obj.GetName()] = obj.GetResourceVersion()
	}
	return versions
}
