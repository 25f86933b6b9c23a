// Package apply is kelp's identity in server-side apply: every object
// kelp owns (its RBAC, system Services, built-in manifests, CRDs, the
// Gateway's published configuration) is applied under the field manager
// "kelp", forced, so that a newer kelp's fields reach a cluster an older
// one made and an edit to them is undone at the next start. Fields kelp
// does not set (a label a user adds) are left alone.
//
// A leaf: the packages that apply import it for these two facts alone.
package apply

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// FieldManager owns every field kelp sets on its objects.
const FieldManager = "kelp"

// Options take the fields kelp sets from whoever changed them: kelp owns
// these objects. Without force, apply would conflict even with an older
// kelp, whose creates the apiserver records as an Update by another
// manager, not as kelp's apply.
func Options() metav1.ApplyOptions {
	return metav1.ApplyOptions{FieldManager: FieldManager, Force: true}
}

// PatchOptions are Options for an apply patch, for clients without an
// Apply method for the object.
func PatchOptions() metav1.PatchOptions {
	force := true
	return metav1.PatchOptions{FieldManager: FieldManager, Force: &force}
}
