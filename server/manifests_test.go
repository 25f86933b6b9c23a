package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

var (
	addonsResource    = schema.GroupVersionResource{Group: "kelp.io", Version: "v1", Resource: "addons"}
	gadgetsResource   = schema.GroupVersionResource{Group: "kelp.test", Version: "v1", Resource: "gadgets"}
	sprocketsResource = schema.GroupVersionResource{Group: "kelp.test", Version: "v1", Resource: "sprockets"}
)

const appManifest = `
apiVersion: v1
kind: ConfigMap
metadata: {name: one, namespace: manifest-test}
data: {version: "1"}
---
apiVersion: v1
kind: Namespace
metadata: {name: manifest-test}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: two}
`

// appManifestEdited changes ConfigMap one and drops ConfigMap two.
const appManifestEdited = `
apiVersion: v1
kind: Namespace
metadata: {name: manifest-test}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: one, namespace: manifest-test}
data: {version: "2"}
`

// The custom object comes before its CustomResourceDefinition.
const gadgetManifest = `
apiVersion: kelp.test/v1
kind: Gadget
metadata: {name: g1}
spec: {size: 3}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.kelp.test}
spec:
  group: kelp.test
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
`

// A kind whose CustomResourceDefinition the test creates later through
// the API, beside an object that applies at once.
const waitingManifest = `{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "beside-sprocket"}},
  {"apiVersion": "kelp.test/v1", "kind": "Sprocket", "metadata": {"name": "s1"}}
]}`

// TestManifests runs a server with manifests in its directory from the
// start and changed while it runs: applied, updated, pruned, removed,
// skipped; a broken file and a kind that is not served yet are reported
// on their Addons while the other files apply. The built-in coredns
// manifest makes the kube-dns Service, which --disable coredns removes.
func TestManifests(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	dir := layout.Server(n.DataDir).Manifests
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("app.yaml", appManifest)
	write("gadget.yaml", gadgetManifest)
	write("broken.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: broken\n")
	write("waiting.json", waitingManifest)
	write("skipped.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: skipped}\n")
	write("skipped.yaml.skip", "")

	n.Start()
	n.WaitReady(startTimeout)
	ctx := context.Background()
	c := n.Client()
	dyn, err := dynamic.NewForConfig(n.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	addons := dyn.Resource(addonsResource).Namespace("kube-system")
	configMap := func(ns, name string) (*corev1.ConfigMap, error) {
		return c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	}
	gone := func(err error) (bool, error) {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}
	applied := func(name string) (status, message string) {
		t.Helper()
		a, err := addons.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(a.Object, "status", "conditions")
		for _, cond := range conds {
			m, _ := cond.(map[string]any)
			if m["type"] == "Applied" {
				return m["status"].(string), m["message"].(string)
			}
		}
		return "", "no Applied condition"
	}
	warned := func(addon, reason, text string) func() (bool, error) {
		return func() (bool, error) {
			events, err := c.CoreV1().Events("kube-system").List(ctx, metav1.ListOptions{
				FieldSelector: "involvedObject.kind=Addon,involvedObject.name=" + addon + ",reason=" + reason,
			})
			if err != nil {
				return false, err
			}
			for _, e := range events.Items {
				if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, text) {
					return true, nil
				}
			}
			return false, nil
		}
	}

	t.Run("applied before the server is ready", func(t *testing.T) {
		if cm, err := configMap("manifest-test", "one"); err != nil || cm.Data["version"] != "1" {
			t.Errorf("ConfigMap manifest-test/one: %v %v", cm.Data, err)
		}
		if _, err := configMap("default", "two"); err != nil {
			t.Errorf("ConfigMap two without a namespace, in default: %v", err)
		}
		if _, err := dyn.Resource(gadgetsResource).Namespace("default").Get(ctx, "g1", metav1.GetOptions{}); err != nil {
			t.Errorf("the Gadget of the CustomResourceDefinition in the same file: %v", err)
		}
		if status, msg := applied("app"); status != "True" {
			t.Errorf("Addon app: Applied %q: %s", status, msg)
		}
		a, err := addons.Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if src, _, _ := unstructured.NestedString(a.Object, "spec", "source"); src != filepath.Join(dir, "app.yaml") {
			t.Errorf("Addon app: source %q", src)
		}
		if sum, _, _ := unstructured.NestedString(a.Object, "spec", "checksum"); len(sum) != 64 {
			t.Errorf("Addon app: checksum %q", sum)
		}
		if objs, _, _ := unstructured.NestedSlice(a.Object, "status", "objects"); len(objs) != 3 {
			t.Errorf("Addon app lists %d objects, want 3: %v", len(objs), objs)
		}
	})

	t.Run("coredns", func(t *testing.T) {
		svc, err := c.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
		if err != nil || svc.Spec.ClusterIP != "10.43.0.10" {
			t.Fatalf("kube-dns Service from the coredns manifest: %v", err)
		}
		if status, msg := applied("coredns"); status != "True" {
			t.Errorf("Addon coredns: Applied %q: %s", status, msg)
		}
		if _, err := c.RbacV1().RoleBindings("kube-system").Get(ctx, "system:kelp-dns", metav1.GetOptions{}); err != nil {
			t.Errorf("DNS RoleBinding: %v", err)
		}
	})

	t.Run("a broken file is reported, the others apply", func(t *testing.T) {
		testcluster.Eventually(t, "an ApplyFailed event on the Addon broken naming its file", warned("broken", "ApplyFailed", filepath.Join(dir, "broken.yaml")))
		if status, _ := applied("broken"); status != "False" {
			t.Errorf("Addon broken: Applied %q", status)
		}
		if !n.Logged("broken.yaml") {
			t.Error("the broken file is not in kelp's log")
		}
	})

	t.Run("skipped", func(t *testing.T) {
		if _, err := configMap("default", "skipped"); !apierrors.IsNotFound(err) {
			t.Errorf("ConfigMap of a skipped file: %v", err)
		}
		if _, err := addons.Get(ctx, "skipped", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Addon of a skipped file: %v", err)
		}
	})

	t.Run("a kind not served yet", func(t *testing.T) {
		if _, err := configMap("default", "beside-sprocket"); err != nil {
			t.Errorf("the ConfigMap beside the Sprocket: %v", err)
		}
		testcluster.Eventually(t, "an ApplyFailed event on the Addon waiting naming the kind", warned("waiting", "ApplyFailed", "Sprocket"))
		if status, _ := applied("waiting"); status != "False" {
			t.Errorf("Addon waiting: Applied %q", status)
		}
		// The kind appears, not through a manifest: a retry applies it.
		crds := apiextclient.NewForConfigOrDie(n.RestConfig()).ApiextensionsV1().CustomResourceDefinitions()
		preserve := true
		if _, err := crds.Create(ctx, &apiextv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: "sprockets.kelp.test"},
			Spec: apiextv1.CustomResourceDefinitionSpec{
				Group: "kelp.test", Scope: apiextv1.NamespaceScoped,
				Names: apiextv1.CustomResourceDefinitionNames{Plural: "sprockets", Singular: "sprocket", Kind: "Sprocket"},
				Versions: []apiextv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
					Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: &preserve}}}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testcluster.Eventually(t, "the Sprocket applied once its kind is served", func() (bool, error) {
			_, err := dyn.Resource(sprocketsResource).Namespace("default").Get(ctx, "s1", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			status, _ := applied("waiting")
			return err == nil && status == "True", err
		})
	})

	t.Run("edited: updated and pruned", func(t *testing.T) {
		write("app.yaml", appManifestEdited)
		testcluster.Eventually(t, "ConfigMap one updated", func() (bool, error) {
			cm, err := configMap("manifest-test", "one")
			return err == nil && cm.Data["version"] == "2", err
		})
		testcluster.Eventually(t, "ConfigMap two, no longer in the file, deleted", func() (bool, error) {
			_, err := configMap("default", "two")
			return gone(err)
		})
	})

	t.Run("removed", func(t *testing.T) {
		if err := os.Remove(filepath.Join(dir, "app.yaml")); err != nil {
			t.Fatal(err)
		}
		testcluster.Eventually(t, "the Addon app deleted", func() (bool, error) {
			_, err := addons.Get(ctx, "app", metav1.GetOptions{})
			return gone(err)
		})
		if _, err := configMap("manifest-test", "one"); !apierrors.IsNotFound(err) {
			t.Errorf("ConfigMap one of a removed file: %v", err)
		}
		if ns, err := c.CoreV1().Namespaces().Get(ctx, "manifest-test", metav1.GetOptions{}); err == nil && ns.DeletionTimestamp == nil {
			t.Error("Namespace manifest-test of a removed file is not being deleted")
		}
	})

	// Recorded before a restart: an unchanged file costs no write.
	gadgetAddon, err := addons.Get(ctx, "gadget", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("disabled after a restart", func(t *testing.T) {
		n.Stop()
		n.Start("--disable", "coredns")
		n.WaitReady(startTimeout)
		if _, err := c.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("kube-dns Service with --disable coredns: %v", err)
		}
		if _, err := c.RbacV1().ClusterRoles().Get(ctx, "system:kelp-dns", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("ClusterRole system:kelp-dns with --disable coredns: %v", err)
		}
		if _, err := addons.Get(ctx, "coredns", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Addon coredns with --disable coredns: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "coredns.yaml")); !os.IsNotExist(err) {
			t.Errorf("coredns.yaml with --disable coredns: %v", err)
		}
		after, err := addons.Get(ctx, "gadget", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if after.GetResourceVersion() != gadgetAddon.GetResourceVersion() {
			t.Errorf("the Addon of an unchanged file was written at the restart: resourceVersion %s, was %s", after.GetResourceVersion(), gadgetAddon.GetResourceVersion())
		}
	})

	t.Run("a CustomResourceDefinition is never deleted", func(t *testing.T) {
		if err := os.Remove(filepath.Join(dir, "gadget.yaml")); err != nil {
			t.Fatal(err)
		}
		testcluster.Eventually(t, "the Addon gadget deleted", func() (bool, error) {
			_, err := addons.Get(ctx, "gadget", metav1.GetOptions{})
			return gone(err)
		})
		if _, err := dyn.Resource(gadgetsResource).Namespace("default").Get(ctx, "g1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the Gadget of a removed file: %v", err)
		}
		crds := apiextclient.NewForConfigOrDie(n.RestConfig()).ApiextensionsV1().CustomResourceDefinitions()
		if crd, err := crds.Get(ctx, gadgetsResource.GroupResource().String(), metav1.GetOptions{}); err != nil || crd.DeletionTimestamp != nil {
			t.Errorf("the CustomResourceDefinition of a removed file was deleted: %v", err)
		}
	})
}
