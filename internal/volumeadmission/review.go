package volumeadmission

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"golang.org/x/time/rate"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	storagehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/kelp-dev/kelp/internal/localstorage"
	"github.com/kelp-dev/kelp/internal/pki"
)

// maxReview caps the AdmissionReview read: a PersistentVolume is small,
// and the apiserver refuses objects of more than 3 MiB anyway.
const maxReview = 3 << 20

// reviewer decides on the volumes nodes' controllers create. It asks the
// apiserver: such creates are rare, and come as soon as the scheduler
// placed the claim, before a cache would have seen it.
type reviewer struct {
	client kubernetes.Interface
	// refusals samples the refusals logged: a node that keeps trying must
	// not fill the server's log. The node sees each refusal in its own.
	refusals *rate.Sometimes
}

func newReviewer(client kubernetes.Interface) *reviewer {
	return &reviewer{client: client, refusals: &rate.Sometimes{First: 5, Interval: time.Minute}}
}

// ServeHTTP answers an AdmissionReview (admission.k8s.io/v1).
func (r *reviewer) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		http.Error(w, "POST an admission.k8s.io/v1 AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, maxReview+1))
	if err != nil {
		http.Error(w, "read the AdmissionReview: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body) > maxReview {
		http.Error(w, fmt.Sprintf("an AdmissionReview of more than %d bytes", maxReview), http.StatusRequestEntityTooLarge)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("want an admission.k8s.io/v1 AdmissionReview with a request: %v", err), http.StatusBadRequest)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	if err := r.review(req.Context(), review.Request); err != nil {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: err.Error()}
		r.refusals.Do(func() {
			log.WithField("user", review.Request.UserInfo.Username).WithError(err).Warn("refused a volume (further refusals are logged once a minute)")
		})
	}
	review.Request = nil
	review.Response = resp
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&review); err != nil {
		log.WithError(err).Debug("write the AdmissionReview")
	}
}

// review says why the request may not be, or nil: a volume created by a
// node's controllers must be one its local-path provisioner makes.
// Anything else passes; the webhook configuration sends only the creates
// of nodes' controllers.
func (r *reviewer) review(ctx context.Context, req *admissionv1.AdmissionRequest) error {
	node, controller := requester(req.UserInfo)
	if !controller || req.Operation != admissionv1.Create || req.Kind.Group != "" || req.Kind.Kind != "PersistentVolume" {
		return nil
	}
	if node == "" {
		return fmt.Errorf("%s is not the identity of one node's controllers (%s<node>), which alone may create volumes: restart kelp on the node that uses it to give it its own", req.UserInfo.Username, pki.ControllerUserPrefix)
	}
	var volume corev1.PersistentVolume
	if err := json.Unmarshal(req.Object.Raw, &volume); err != nil {
		return fmt.Errorf("read the PersistentVolume: %w", err)
	}
	return r.check(ctx, node, &volume)
}

// requester names the node whose controllers made a request, and says
// whether they are a node's controllers at all: the same requests as the
// webhook configuration's match condition. The shared identity and a
// member of the group with a name of its own are controllers of no node.
func requester(u authenticationv1.UserInfo) (node string, controller bool) {
	if n, ok := strings.CutPrefix(u.Username, pki.ControllerUserPrefix); ok {
		return n, true
	}
	return "", u.Username == pki.SharedControllerUser || slices.Contains(u.Groups, pki.ControllerGroup)
}

// check says why node's controllers may not create volume, or nil: it
// must be pre-bound to a claim that exists with that UID, is not bound,
// is of a class the local-path provisioner serves (the volume's too), and
// that the scheduler placed on node.
func (r *reviewer) check(ctx context.Context, node string, volume *corev1.PersistentVolume) error {
	deny := func(format string, args ...any) error {
		return fmt.Errorf("a node's controllers may create only the local-path volume of a claim the scheduler placed on their node: volume %s of %s: %s",
			volume.Name, pki.ControllerUserPrefix+node, fmt.Sprintf(format, args...))
	}
	ref := volume.Spec.ClaimRef
	if ref == nil || ref.Namespace == "" || ref.Name == "" || ref.UID == "" {
		return deny("spec.claimRef does not name a claim by namespace, name and UID")
	}
	key := ref.Namespace + "/" + ref.Name
	claim, err := r.client.CoreV1().PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return deny("claim %s does not exist", key)
	case err != nil:
		return deny("look up claim %s: %v", key, err)
	case claim.UID != ref.UID:
		return deny("claim %s has UID %s, not %s", key, claim.UID, ref.UID)
	case claim.Spec.VolumeName != "":
		return deny("claim %s is bound to volume %s already", key, claim.Spec.VolumeName)
	}
	className := storagehelpers.GetPersistentVolumeClaimClass(claim)
	class, err := r.client.StorageV1().StorageClasses().Get(ctx, className, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return deny("claim %s is of storage class %q, which does not exist", key, className)
	case err != nil:
		return deny("look up storage class %q: %v", className, err)
	case class.Provisioner != localstorage.Provisioner:
		return deny("claim %s is of storage class %q, whose provisioner is %s, not %s", key, className, class.Provisioner, localstorage.Provisioner)
	case volume.Spec.StorageClassName != className:
		return deny("the volume is of storage class %q, its claim %s of %q", volume.Spec.StorageClassName, key, className)
	}
	if placed := claim.Annotations[storagehelpers.AnnSelectedNode]; placed != node {
		if placed == "" {
			return deny("the scheduler has not placed claim %s on a node (no %s annotation)", key, storagehelpers.AnnSelectedNode)
		}
		return deny("the scheduler placed claim %s on node %s (%s)", key, placed, storagehelpers.AnnSelectedNode)
	}
	return nil
}
