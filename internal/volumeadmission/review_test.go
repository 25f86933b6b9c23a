package volumeadmission

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func claim(mutate ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "data-0", UID: "uid-0",
			Annotations: map[string]string{"volume.kubernetes.io/selected-node": "n1"}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To("local-path")},
	}
	for _, m := range mutate {
		m(c)
	}
	return c
}

func volume(mutate ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	v := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pvc-uid-0", Labels: map[string]string{"kelp.io/local-path-node": "n1"}},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/var/lib/kelp/storage/pvc-uid-0_apps_data-0"}},
			ClaimRef:               &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "apps", Name: "data-0", UID: "uid-0"},
			StorageClassName:       "local-path",
		},
	}
	for _, m := range mutate {
		m(v)
	}
	return v
}

func class(name, provisioner string) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner}
}

var n1 = authenticationv1.UserInfo{Username: "system:kelp-controller:n1", Groups: []string{"system:kelp-controllers", "system:authenticated"}}

// ask sends r an AdmissionReview of a create of v by user, as the
// apiserver does, and returns its answer.
func ask(t *testing.T, r http.Handler, user authenticationv1.UserInfo, v *corev1.PersistentVolume) *admissionv1.AdmissionResponse {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "review-1",
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "PersistentVolume"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "persistentvolumes"},
			Name:      v.Name,
			Operation: admissionv1.Create,
			UserInfo:  user,
			Object:    runtime.RawExtension{Raw: raw},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var got admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Response == nil {
		t.Fatalf("answer %s: %v", rec.Body, err)
	}
	if got.Response.UID != "review-1" {
		t.Errorf("answer for review %q, want review-1", got.Response.UID)
	}
	return got.Response
}

// A node's controllers may create a volume only pre-bound to an unbound
// claim of a local-path class that the scheduler placed on their node:
// otherwise a node could pull another namespace's pending claim, and its
// pod, to itself.
func TestReview(t *testing.T) {
	for _, tc := range []struct {
		name    string
		user    authenticationv1.UserInfo
		claims  []runtime.Object
		volume  *corev1.PersistentVolume
		refusal string // empty: allowed
	}{
		{name: "the volume of a claim placed on the node", user: n1, claims: []runtime.Object{claim()}, volume: volume()},
		{name: "a class of the user's own served by the local-path provisioner", user: n1,
			claims: []runtime.Object{claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = ptr.To("fast") })},
			volume: volume(func(v *corev1.PersistentVolume) { v.Spec.StorageClassName = "fast" })},
		{name: "no claimRef", user: n1, claims: []runtime.Object{claim()},
			volume:  volume(func(v *corev1.PersistentVolume) { v.Spec.ClaimRef = nil }),
			refusal: "spec.claimRef does not name a claim"},
		{name: "a claimRef without a UID", user: n1, claims: []runtime.Object{claim()},
			volume:  volume(func(v *corev1.PersistentVolume) { v.Spec.ClaimRef.UID = "" }),
			refusal: "spec.claimRef does not name a claim"},
		{name: "another UID", user: n1, claims: []runtime.Object{claim()},
			volume:  volume(func(v *corev1.PersistentVolume) { v.Spec.ClaimRef.UID = "uid-old" }),
			refusal: "claim apps/data-0 has UID uid-0, not uid-old"},
		{name: "a bound claim", user: n1,
			claims:  []runtime.Object{claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = "pvc-uid-0" })},
			volume:  volume(),
			refusal: "claim apps/data-0 is bound to volume pvc-uid-0 already"},
		{name: "a class of another provisioner", user: n1,
			claims:  []runtime.Object{claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = ptr.To("nfs") })},
			volume:  volume(func(v *corev1.PersistentVolume) { v.Spec.StorageClassName = "nfs" }),
			refusal: `claim apps/data-0 is of storage class "nfs", whose provisioner is example.com/nfs, not kelp.io/local-path`},
		{name: "a class that does not exist", user: n1,
			claims:  []runtime.Object{claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = ptr.To("gone") })},
			volume:  volume(func(v *corev1.PersistentVolume) { v.Spec.StorageClassName = "gone" }),
			refusal: `storage class "gone", which does not exist`},
		{name: "a volume of another class than its claim", user: n1, claims: []runtime.Object{claim()},
			volume:  volume(func(v *corev1.PersistentVolume) { v.Spec.StorageClassName = "fast" }),
			refusal: `the volume is of storage class "fast", its claim apps/data-0 of "local-path"`},
		{name: "a claim placed on another node", user: n1,
			claims:  []runtime.Object{claim(func(c *corev1.PersistentVolumeClaim) { c.Annotations["volume.kubernetes.io/selected-node"] = "n2" })},
			volume:  volume(),
			refusal: "the scheduler placed claim apps/data-0 on node n2"},
		{name: "a claim not placed yet", user: n1,
			claims:  []runtime.Object{claim(func(c *corev1.PersistentVolumeClaim) { c.Annotations = nil })},
			volume:  volume(),
			refusal: "the scheduler has not placed claim apps/data-0 on a node"},
		{name: "a claim that does not exist", user: n1, volume: volume(), refusal: "claim apps/data-0 does not exist"},
		{name: "the shared identity", user: authenticationv1.UserInfo{Username: "system:kelp-controller"}, claims: []runtime.Object{claim()},
			volume: volume(), refusal: "system:kelp-controller is not the identity of one node's controllers"},
		{name: "a member of the group without a node's name", user: authenticationv1.UserInfo{Username: "someone", Groups: []string{"system:kelp-controllers"}},
			claims: []runtime.Object{claim()}, volume: volume(), refusal: "someone is not the identity of one node's controllers"},
		{name: "anyone else", user: authenticationv1.UserInfo{Username: "system:admin", Groups: []string{"system:masters"}},
			volume: volume(func(v *corev1.PersistentVolume) { v.Spec.ClaimRef = nil })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objects := append(tc.claims, class("local-path", "kelp.io/local-path"), class("fast", "kelp.io/local-path"), class("nfs", "example.com/nfs"))
			r := newReviewer(fake.NewClientset(objects...))
			got := ask(t, r, tc.user, tc.volume)
			switch {
			case tc.refusal == "" && !got.Allowed:
				t.Errorf("refused: %+v", got.Result)
			case tc.refusal == "":
			case got.Allowed:
				t.Errorf("allowed, want refused with %q", tc.refusal)
			case got.Result == nil || got.Result.Code != http.StatusForbidden || got.Result.Reason != metav1.StatusReasonForbidden:
				t.Errorf("refused with %+v, want 403 Forbidden", got.Result)
			case !strings.Contains(got.Result.Message, tc.refusal):
				t.Errorf("refused with %q, want it to say %q", got.Result.Message, tc.refusal)
			}
		})
	}
}

func TestReviewRefusesWhatIsNotAReview(t *testing.T) {
	r := newReviewer(fake.NewClientset())
	for _, tc := range []struct {
		method, body string
		want         int
	}{
		{http.MethodGet, "", http.StatusMethodNotAllowed},
		{http.MethodPost, "not json", http.StatusBadRequest},
		{http.MethodPost, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, http.StatusBadRequest},
		{http.MethodPost, strings.Repeat(" ", maxReview+1), http.StatusRequestEntityTooLarge},
	} {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(tc.method, Path, strings.NewReader(tc.body)))
		if rec.Code != tc.want {
			t.Errorf("%s %.20q: %d, want %d", tc.method, tc.body, rec.Code, tc.want)
		}
	}
}
