package addons

import (
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func names(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, refOf(o).String())
	}
	return out
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       []string
	}{
		{"multi-document YAML with empty documents and comments", `
# leading comment
---
apiVersion: v1
kind: ConfigMap
metadata: {name: a, namespace: x}
---
---
# only a comment
---
apiVersion: v1
kind: Namespace
metadata:
  name: x
`, []string{"ConfigMap x/a", "Namespace x"}},
		{"List", `
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: a}
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: b, namespace: other}
`, []string{"ConfigMap a", "Deployment.apps other/b"}},
		{"JSON", `{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "j"}}`, []string{"ConfigMap j"}},
		{"JSON List", `{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}]}`, []string{"Secret s"}},
		{"an object with a field named items is no list", `
apiVersion: example.com/v1
kind: Basket
metadata: {name: b}
items: [{apiVersion: v1, kind: ConfigMap}]
`, []string{"Basket.example.com b"}},
		{"empty", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := parse([]byte(tc.data))
			if err != nil {
				t.Fatal(err)
			}
			if got := names(objs); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("objects %q, want %q", got, tc.want)
			}
		})
	}
}

func TestParseRefusesTheWholeFile(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"bad YAML in the second document", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\nkind: [unclosed\n", "document 2"},
		{"no name", "apiVersion: v1\nkind: ConfigMap\n", "metadata.name"},
		{"no kind, no version", "metadata: {name: a}\n", "apiVersion, kind"},
		{"bad list item", "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: a}\n- kind: Secret\n  metadata: {name: b}\n", "item 2: object without apiVersion"},
		{"bad JSON", `{"apiVersion": "v1", "kind": `, "document 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := parse([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parse: %v %v, want an error with %q", names(objs), err, tc.want)
			}
		})
	}
}

func TestApplyOrderPutsNamespacesAndCRDsFirst(t *testing.T) {
	objs, err := parse([]byte(`
apiVersion: example.com/v1
kind: Widget
metadata: {name: w, namespace: ns}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c, namespace: ns}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
---
apiVersion: v1
kind: Namespace
metadata: {name: ns}
`))
	if err != nil {
		t.Fatal(err)
	}
	applyOrder(objs)
	want := []string{"Namespace ns", "CustomResourceDefinition.apiextensions.k8s.io widgets.example.com", "Widget.example.com ns/w", "ConfigMap ns/c"}
	if got := names(objs); !reflect.DeepEqual(got, want) {
		t.Errorf("order %q, want %q", got, want)
	}
}

func TestChecksum(t *testing.T) {
	a, b := checksum([]byte("x: 1\n")), checksum([]byte("x: 2\n"))
	if a == b || len(a) != 64 || a != checksum([]byte("x: 1\n")) {
		t.Errorf("checksums %s and %s", a, b)
	}
}

func TestManifestNames(t *testing.T) {
	for name, want := range map[string]bool{
		"app.yaml": true, "app.yml": true, "app.json": true,
		"app.yaml.skip": false, "app.txt": false, ".app.yaml.tmp-123": false, ".app.yaml": false, "README": false,
	} {
		if got := isManifest(name); got != want {
			t.Errorf("isManifest(%q) = %v", name, got)
		}
	}
	for name, want := range map[string]bool{"app.yaml": true, "app.yaml.skip": true, "app.json.skip": true, "app.txt.skip": false, ".app.yaml.tmp-1": false} {
		if got := concerns(name); got != want {
			t.Errorf("concerns(%q) = %v", name, got)
		}
	}
	if got := addonName("local-storage.yaml"); got != "local-storage" {
		t.Errorf("addonName = %q", got)
	}
}

func ref(apiVersion, kind, ns, name string) Ref {
	return Ref{APIVersion: apiVersion, Kind: kind, Namespace: ns, Name: name}
}

func TestStale(t *testing.T) {
	ns := ref("v1", "Namespace", "", "x")
	cm := ref("v1", "ConfigMap", "x", "a")
	gone := ref("v1", "ConfigMap", "x", "gone")
	movedAway := ref("v1", "ConfigMap", "x", "moved")
	deployV1beta1 := ref("apps/v1beta1", "Deployment", "x", "d")
	deployV1 := ref("apps/v1", "Deployment", "x", "d")
	crd := ref("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "widgets.example.com")
	widget := ref("example.com/v1", "Widget", "x", "w")

	for _, tc := range []struct {
		name           string
		was, now, kept []Ref
		want           []Ref
	}{
		{"nothing left the file", []Ref{ns, cm}, []Ref{ns, cm}, nil, nil},
		{"an object left the file", []Ref{ns, cm, gone}, []Ref{ns, cm}, nil, []Ref{gone}},
		{"another manifest applies it now", []Ref{ns, cm, movedAway}, []Ref{ns, cm}, []Ref{movedAway}, nil},
		{"a new API version is the same object", []Ref{deployV1beta1}, []Ref{deployV1}, nil, nil},
		{"a removed file: last applied first", []Ref{ns, crd, widget, cm}, nil, nil, []Ref{cm, widget, crd, ns}},
		{"the same name in another namespace is another object", []Ref{cm}, []Ref{ref("v1", "ConfigMap", "y", "a")}, nil, []Ref{cm}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stale(tc.was, tc.now, tc.kept); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("stale = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestUnionKeepsTrackOfWhatMayExist(t *testing.T) {
	a, b, c := ref("v1", "ConfigMap", "x", "a"), ref("v1", "ConfigMap", "x", "b"), ref("v1", "ConfigMap", "x", "c")
	old, newer := ref("apps/v1beta1", "Deployment", "x", "d"), ref("apps/v1", "Deployment", "x", "d")
	got := union([]Ref{a, b, old}, []Ref{c, newer, a})
	want := []Ref{c, newer, a, b}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("union = %v, want %v", got, want)
	}
}

func TestShortenKeepsUTF8(t *testing.T) {
	long := strings.Repeat("é", 1000)
	got := shorten(long)
	if len(got) > 1024 || !strings.HasSuffix(got, "...") || !utf8.ValidString(got) {
		t.Errorf("shorten: %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
	if shorten("short") != "short" {
		t.Error("a short message changed")
	}
}
