package helmchart

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// A HelmChart has work while its spec is not the deployed one or while it
// is deleted with kelp's finalizer on; each spec and the deletion are work
// of their own, with a backoff of their own.
func TestWorkKey(t *testing.T) {
	spec := map[string]any{"chart": "web", "repo": "http://charts.example"}
	chart := func(generation int64, finalizers []any, deployedHash string, deleting bool) *unstructured.Unstructured {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.cattle.io/v1", "kind": "HelmChart",
			"metadata": map[string]any{"namespace": "apps", "name": "web", "generation": generation},
			"spec":     spec,
		}}
		if finalizers != nil {
			obj.Object["metadata"].(map[string]any)["finalizers"] = finalizers
		}
		if deployedHash != "" {
			obj.Object["status"] = map[string]any{
				"specHash":   deployedHash,
				"conditions": []any{map[string]any{"type": ConditionDeployed, "status": "True", "reason": ReasonInstalled, "lastTransitionTime": "2026-11-25T00:00:00Z", "message": ""}},
			}
		}
		if deleting {
			now := metav1.Now()
			obj.SetDeletionTimestamp(&now)
		}
		return obj
	}
	hc, err := decode(chart(1, nil, "", false))
	if err != nil {
		t.Fatal(err)
	}
	hash := hc.Spec.Hash()
	finalized := []any{Finalizer}

	for _, tc := range []struct {
		name string
		obj  *unstructured.Unstructured
		want string
	}{
		{"new", chart(1, nil, "", false), "apps/web@1"},
		{"no finalizer yet", chart(1, nil, hash, false), "apps/web@1"},
		{"deployed", chart(1, finalized, hash, false), ""},
		{"new spec", chart(2, finalized, "an older spec's", false), "apps/web@2"},
		{"deleted", chart(2, finalized, hash, true), "apps/web@2 uninstall"},
		{"uninstalled", chart(2, nil, hash, true), ""},
	} {
		if got := workKey(tc.obj); got != tc.want {
			t.Errorf("%s: work %q, want %q", tc.name, got, tc.want)
		}
	}
}
