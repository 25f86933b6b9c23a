package localstorage

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// claim is a claim of 1Gi, ReadWriteOnce, of the class local-path, that
// the scheduler placed on node n1 and the binder handed to kelp.
func claim(name string, change ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "apps", Name: name, UID: types.UID("uid-" + name[len(name)-1:]),
			Annotations: map[string]string{
				"volume.kubernetes.io/selected-node":       "n1",
				"volume.kubernetes.io/storage-provisioner": Provisioner,
			},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To("local-path"),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	for _, f := range change {
		f(c)
	}
	return c
}

func class(name string, reclaim *corev1.PersistentVolumeReclaimPolicy) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: Provisioner, ReclaimPolicy: reclaim}
}

func TestVolumeFor(t *testing.T) {
	c := claim("data-0", func(c *corev1.PersistentVolumeClaim) {
		c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
	})
	got := volumeFor(c, class("local-path", nil), "n1", "/var/lib/kelp/storage/pvc-uid-0_apps_data-0")
	filesystem := corev1.PersistentVolumeFilesystem
	want := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "pvc-uid-0",
			Labels:      map[string]string{NodeLabel: "n1"},
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": "kelp.io/local-path"},
			Finalizers:  []string{"kelp.io/local-path"},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/var/lib/kelp/storage/pvc-uid-0_apps_data-0"}},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod},
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "apps", Name: "data-0", UID: "uid-0"},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              "local-path",
			VolumeMode:                    &filesystem,
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}},
			}}}},
		},
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("volume:\n%+v\nwant\n%+v", got, want)
	}
	retain := volumeFor(c, class("keep", ptr.To(corev1.PersistentVolumeReclaimRetain)), "n1", "/s/x")
	if retain.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain || retain.Spec.StorageClassName != "keep" {
		t.Errorf("a class that retains gives %s of class %s", retain.Spec.PersistentVolumeReclaimPolicy, retain.Spec.StorageClassName)
	}
	if retain.Finalizers != nil {
		t.Errorf("a volume of a class that retains has finalizers %v: nothing is removed with it", retain.Finalizers)
	}
}

func TestDirName(t *testing.T) {
	if got := dirName(claim("data-0")); got != "pvc-uid-0_apps_data-0" {
		t.Errorf("dirName = %q", got)
	}
	v := volumeFor(claim("data-0"), class("local-path", nil), "n1", "/s/"+dirName(claim("data-0")))
	if !ownDir("/s", v) {
		t.Error("a claim's own directory is not its volume's")
	}
}

// Only the directory kelp made for a volume, right under the storage
// path, may be removed with it.
func TestOwnDir(t *testing.T) {
	const root = "/var/lib/kelp/storage"
	for path, want := range map[string]bool{
		root + "/pvc-uid-1_apps_data-1":       true,
		root:                                  false,
		root + "/":                            false,
		root + "/pvc-uid-1/../../../etc":      false,
		root + "/../pvc-uid-1_apps_data-1":    false,
		root + "/pvc-uid-1_apps_data-1/":      false,
		root + "//pvc-uid-1_apps_data-1":      false,
		root + "/pvc-uid-1_apps_data-1/sub":   false,
		root + "/data":                        false,
		root + "/..":                          false,
		root + "-other/pvc-uid-1_apps_data-1": false,
		root[1:] + "/pvc-uid-1_apps_data-1":   false,
		"/etc":                                false,
		"":                                    false,
		root + "/pvc-uid-1_apps_data-1/../pvc-uid-2":   false,
		root + "/pvc-uid-2_apps_data-2":                false, // another claim's
		root + "/pvc-uid-1":                            false,
		root + "/pvc-uid-1_apps_data-1x":               false,
		root + "/pvc-uid-1_other_data-1":               false,
		root + "/pvc-uid-1_apps_data-1/../pvc-uid-1_x": false,
	} {
		v := volumeFor(claim("data-1"), class("local-path", nil), "n1", path)
		if got := ownDir(root, v); got != want {
			t.Errorf("ownDir(%q) = %v, want %v", path, got, want)
		}
	}
	// Forged: a volume that points at claim data-2's directory.
	dir := root + "/" + dirName(claim("data-2"))
	for name, change := range map[string]func(*corev1.PersistentVolume){
		"another claim's volume": func(*corev1.PersistentVolume) {},
		"the claim's reference, another name": func(v *corev1.PersistentVolume) {
			c := claim("data-2")
			v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: c.Namespace, Name: c.Name, UID: c.UID}
		},
		"no claim":     func(v *corev1.PersistentVolume) { v.Spec.ClaimRef = nil },
		"no claim UID": func(v *corev1.PersistentVolume) { v.Spec.ClaimRef.UID = "" },
		"no local path": func(v *corev1.PersistentVolume) {
			v.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}
		},
	} {
		v := volumeFor(claim("data-1"), class("local-path", nil), "n1", dir)
		change(v)
		if ownDir(root, v) {
			t.Errorf("%s: its path %s is its own", name, dir)
		}
	}
}

func TestRefusal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*corev1.PersistentVolumeClaim)
		want   string // in the refusal; empty: none
	}{
		{"ReadWriteOnce", func(*corev1.PersistentVolumeClaim) {}, ""},
		{"ReadWriteOncePod", func(c *corev1.PersistentVolumeClaim) {
			c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
		}, ""},
		{"Filesystem", func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeFilesystem) }, ""},
		{"ReadWriteMany", func(c *corev1.PersistentVolumeClaim) {
			c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadWriteMany}
		}, "access mode ReadWriteMany is not supported"},
		{"ReadOnlyMany", func(c *corev1.PersistentVolumeClaim) {
			c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany}
		}, "access mode ReadOnlyMany is not supported"},
		{"Block", func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeBlock) }, "volume mode Block is not supported"},
		{"selector", func(c *corev1.PersistentVolumeClaim) { c.Spec.Selector = &metav1.LabelSelector{} }, "selector is not supported"},
		{"data source", func(c *corev1.PersistentVolumeClaim) {
			c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "other"}
		}, "data source is not supported"},
	} {
		err := refusal(claim("data-0", tc.change))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: refusal %v, want %q in it", tc.name, err, tc.want)
		}
	}
}

func TestWantsVolume(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*corev1.PersistentVolumeClaim)
		want   bool
	}{
		{"placed and handed over", func(*corev1.PersistentVolumeClaim) {}, true},
		{"by the beta annotation", func(c *corev1.PersistentVolumeClaim) {
			delete(c.Annotations, "volume.kubernetes.io/storage-provisioner")
			c.Annotations["volume.beta.kubernetes.io/storage-provisioner"] = Provisioner
		}, true},
		{"on another node", func(c *corev1.PersistentVolumeClaim) { c.Annotations["volume.kubernetes.io/selected-node"] = "n2" }, false},
		{"not placed yet", func(c *corev1.PersistentVolumeClaim) { delete(c.Annotations, "volume.kubernetes.io/selected-node") }, false},
		{"not handed over", func(c *corev1.PersistentVolumeClaim) {
			delete(c.Annotations, "volume.kubernetes.io/storage-provisioner")
		}, false},
		{"another provisioner's", func(c *corev1.PersistentVolumeClaim) {
			c.Annotations["volume.kubernetes.io/storage-provisioner"] = "rancher.io/local-path"
		}, false},
		{"bound", func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = "pvc-x" }, false},
		{"being deleted", func(c *corev1.PersistentVolumeClaim) { c.DeletionTimestamp = &metav1.Time{} }, false},
	} {
		if got := wantsVolume(claim("data-0", tc.change), "n1"); got != tc.want {
			t.Errorf("%s: wantsVolume = %v", tc.name, got)
		}
	}
}

func TestToDelete(t *testing.T) {
	released := func(change func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
		v := volumeFor(claim("data-0"), class("local-path", nil), "n1", "/s/pvc-uid-0_apps_data-0")
		v.Status.Phase = corev1.VolumeReleased
		change(v)
		return v
	}
	for _, tc := range []struct {
		name   string
		change func(*corev1.PersistentVolume)
		want   bool
	}{
		{"released", func(*corev1.PersistentVolume) {}, true},
		{"bound", func(v *corev1.PersistentVolume) { v.Status.Phase = corev1.VolumeBound }, false},
		{"retained", func(v *corev1.PersistentVolume) {
			v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
		}, false},
		{"someone else's", func(v *corev1.PersistentVolume) { v.Annotations["pv.kubernetes.io/provisioned-by"] = "other" }, false},
		{"deleted by hand", func(v *corev1.PersistentVolume) { v.DeletionTimestamp = &metav1.Time{} }, true},
		{"deleted by hand, still bound", func(v *corev1.PersistentVolume) {
			v.DeletionTimestamp = &metav1.Time{}
			v.Finalizers = append(v.Finalizers, "kubernetes.io/pv-protection")
		}, false},
		{"deleted, kelp's part done", func(v *corev1.PersistentVolume) {
			v.DeletionTimestamp = &metav1.Time{}
			v.Finalizers = nil
		}, false},
	} {
		if got := toDelete(released(tc.change)); got != tc.want {
			t.Errorf("%s: toDelete = %v", tc.name, got)
		}
	}
}
