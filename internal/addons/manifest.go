package addons

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// SkipSuffix marks a manifest kelp leaves alone: NAME.yaml.skip beside
// NAME.yaml.
const SkipSuffix = ".skip"

// isManifest says whether a file of the manifests directory is applied.
// Hidden files are not: editors and atomicfile write their temporary
// copies under such names.
func isManifest(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch filepath.Ext(name) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// addonName is the name of the Addon of a manifest file: the file's name
// without its extension.
func addonName(file string) string {
	return strings.TrimSuffix(file, filepath.Ext(file))
}

// checksum is what an Addon records of the content it applied.
func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// parse reads the objects of a manifest: YAML documents separated by
// "---" or JSON, each an object or a List of them. Empty documents are
// skipped. A file with one bad document is refused whole, so that a typo
// never prunes what the rest of the file still holds.
func parse(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for doc := 1; ; doc++ {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if !isList(u) {
			if err := checkObject(u); err != nil {
				return nil, fmt.Errorf("document %d: %w", doc, err)
			}
			objs = append(objs, u)
			continue
		}
		item := 0
		err := u.EachListItem(func(o runtime.Object) error {
			item++
			obj, ok := o.(*unstructured.Unstructured)
			if !ok {
				return fmt.Errorf("item %d is not an object", item)
			}
			if err := checkObject(obj); err != nil {
				return fmt.Errorf("item %d: %w", item, err)
			}
			objs = append(objs, obj)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", doc, u.GetKind(), err)
		}
	}
}

// isList says whether u is a list of objects (kind List, or a typed list
// such as ConfigMapList) rather than an object with a field named items.
func isList(u *unstructured.Unstructured) bool {
	return strings.HasSuffix(u.GetKind(), "List") && u.IsList()
}

// checkObject refuses what server-side apply cannot apply: an object
// without a kind, an API version or a name.
func checkObject(u *unstructured.Unstructured) error {
	var missing []string
	if u.GetAPIVersion() == "" {
		missing = append(missing, "apiVersion")
	} else if _, err := schema.ParseGroupVersion(u.GetAPIVersion()); err != nil {
		return err
	}
	if u.GetKind() == "" {
		missing = append(missing, "kind")
	}
	if u.GetName() == "" {
		missing = append(missing, "metadata.name")
	}
	if missing != nil {
		return fmt.Errorf("object without %s", strings.Join(missing, ", "))
	}
	return nil
}

// applyOrder sorts objects for applying, stably: Namespaces first, then
// CustomResourceDefinitions, then the rest in file order, so that a file
// may list an object before the namespace or the kind it needs.
func applyOrder(objs []*unstructured.Unstructured) {
	rank := func(u *unstructured.Unstructured) int {
		switch u.GroupVersionKind().GroupKind() {
		case schema.GroupKind{Kind: "Namespace"}:
			return 0
		case crdKind:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int { return rank(a) - rank(b) })
}

// appliedFirst says whether an object is applied before the other objects
// of every manifest of a pass: what objects of other files may need.
func appliedFirst(u *unstructured.Unstructured) bool {
	gk := u.GroupVersionKind().GroupKind()
	return gk == schema.GroupKind{Kind: "Namespace"} || gk == crdKind
}

// Ref names an object applied from a manifest, as its Addon's status
// lists it.
type Ref struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
}

func refOf(u *unstructured.Unstructured) Ref {
	return Ref{APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName()}
}

// identity is an object whatever API version names it: a manifest that
// moves an object to a newer version has not removed it.
type identity struct {
	group, kind, namespace, name string
}

func (r Ref) identity() identity {
	gv, _ := schema.ParseGroupVersion(r.APIVersion) // a bad version names no object; it cannot match one
	return identity{gv.Group, r.Kind, r.Namespace, r.Name}
}

func (r Ref) String() string {
	gk := schema.FromAPIVersionAndKind(r.APIVersion, r.Kind).GroupKind().String()
	if r.Namespace == "" {
		return gk + " " + r.Name
	}
	return gk + " " + r.Namespace + "/" + r.Name
}

// stale is what pruning deletes after a manifest was applied in full: the
// objects it applied before (was) and not now (now), except those another
// manifest applies (kept), last applied first.
func stale(was, now, kept []Ref) []Ref {
	keep := map[identity]bool{}
	for _, r := range slices.Concat(now, kept) {
		keep[r.identity()] = true
	}
	var out []Ref
	for _, r := range slices.Backward(was) {
		if !keep[r.identity()] {
			out = append(out, r)
		}
	}
	return out
}

// union is now followed by what of was is not in it: the objects to keep
// track of after a manifest was applied in part, under the API versions
// it names them by now.
func union(was, now []Ref) []Ref {
	seen := map[identity]bool{}
	var out []Ref
	for _, r := range slices.Concat(now, was) {
		if !seen[r.identity()] {
			seen[r.identity()] = true
			out = append(out, r)
		}
	}
	return out
}
