package addons

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kelp-dev/kelp/embed"
)

var testValues = Values{ClusterDNS: "10.43.0.10", ClusterDomain: "cluster.local", ServingCA: "LS0tLS1CRUdJTi0tLS0t"}

func builtins() fs.FS {
	return fstest.MapFS{
		"dns.yaml":     {Data: []byte("apiVersion: v1\nkind: Service\nmetadata: {name: dns}\nspec: {clusterIP: \"{{ .ClusterDNS }}\"}\n")},
		"storage.yaml": {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: storage}\ndata: {domain: \"{{ .ClusterDomain }}\"}\n")},
		"README.md":    {Data: []byte("not a manifest")},
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestStageWritesRenderedBuiltins(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "manifests")
	if err := Stage(dir, builtins(), testValues, nil); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(dir, "dns.yaml")); !strings.Contains(got, `clusterIP: "10.43.0.10"`) {
		t.Errorf("dns.yaml:\n%s", got)
	}
	if got := read(t, filepath.Join(dir, "storage.yaml")); !strings.Contains(got, `domain: "cluster.local"`) {
		t.Errorf("storage.yaml:\n%s", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "README.md")); err == nil {
		t.Error("README.md staged")
	}

	// Unchanged content is not written again; changed content is.
	old := time.Now().Add(-time.Hour)
	for _, f := range []string{"dns.yaml", "storage.yaml"} {
		if err := os.Chtimes(filepath.Join(dir, f), old, old); err != nil {
			t.Fatal(err)
		}
	}
	v := testValues
	v.ClusterDomain = "example.internal"
	if err := Stage(dir, builtins(), v, nil); err != nil {
		t.Fatal(err)
	}
	if info, _ := os.Stat(filepath.Join(dir, "dns.yaml")); !info.ModTime().Equal(old) {
		t.Errorf("dns.yaml rewritten with the same content at %s", info.ModTime())
	}
	if got := read(t, filepath.Join(dir, "storage.yaml")); !strings.Contains(got, "example.internal") {
		t.Errorf("storage.yaml not updated:\n%s", got)
	}
}

func TestStageSkipAndDisable(t *testing.T) {
	dir := t.TempDir()
	if err := Stage(dir, builtins(), testValues, nil); err != nil {
		t.Fatal(err)
	}
	// The user's edited copy, kept by a .skip file, stays as it is,
	// disabled or not.
	edited := "# mine\n"
	if err := os.WriteFile(filepath.Join(dir, "dns.yaml"), []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "dns.yaml.skip"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Stage(dir, builtins(), testValues, []string{"storage", "dns"}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(dir, "dns.yaml")); got != edited {
		t.Errorf("dns.yaml with a .skip file became:\n%s", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "storage.yaml")); !os.IsNotExist(err) {
		t.Errorf("disabled storage.yaml: %v, want it removed", err)
	}
	// Disabled twice: nothing left to remove is no error.
	if err := Stage(dir, builtins(), testValues, []string{"storage"}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if want := []string{"dns.yaml", "dns.yaml.skip"}; !reflect.DeepEqual(got, want) {
		t.Errorf("directory holds %v, want %v", got, want)
	}
}

func TestStageRefusesAnUnknownValue(t *testing.T) {
	bad := fstest.MapFS{"bad.yaml": {Data: []byte("x: {{ .NoSuchValue }}\n")}}
	err := Stage(t.TempDir(), bad, testValues, nil)
	if err == nil || !strings.Contains(err.Error(), "bad.yaml") || !strings.Contains(err.Error(), "NoSuchValue") {
		t.Errorf("Stage with an unknown value: %v", err)
	}
}

// Every built-in manifest renders with kelp's values into objects the
// manifests controller can apply.
func TestBuiltinManifestsRenderAndParse(t *testing.T) {
	files, err := fs.Glob(embed.Manifests(), "*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("built-in manifests: %v %v", files, err)
	}
	for _, file := range files {
		data, err := render(embed.Manifests(), file, testValues)
		if err != nil {
			t.Errorf("%s: %v", file, err)
			continue
		}
		objs, err := parse(data)
		if err != nil {
			t.Errorf("%s: %v", file, err)
			continue
		}
		if len(objs) == 0 {
			t.Errorf("%s holds no object", file)
		}
	}
}

func TestCoreDNSManifest(t *testing.T) {
	data, err := render(embed.Manifests(), "coredns.yaml", testValues)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parse(data)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ClusterRole.rbac.authorization.k8s.io system:kelp-dns",
		"ClusterRoleBinding.rbac.authorization.k8s.io system:kelp-dns",
		"Role.rbac.authorization.k8s.io kube-system/system:kelp-dns",
		"RoleBinding.rbac.authorization.k8s.io kube-system/system:kelp-dns",
		"Service kube-system/kube-dns",
	}
	if got := names(objs); !reflect.DeepEqual(got, want) {
		t.Fatalf("coredns.yaml holds %q, want %q", got, want)
	}
	svc := objs[4]
	if ip, _, _ := unstructured.NestedString(svc.Object, "spec", "clusterIP"); ip != "10.43.0.10" {
		t.Errorf("kube-dns clusterIP %q", ip)
	}
	if _, ok := svc.Object["spec"].(map[string]any)["selector"]; ok {
		t.Error("kube-dns has a selector; every node answers on the address itself")
	}
}
