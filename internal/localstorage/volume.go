package localstorage

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
)

const (
	// Provisioner is the provisioner of the local-path StorageClass, and of
	// any class of the user's own that is served the same way.
	Provisioner = "kelp.io/local-path"
	// NodeLabel names, on each volume kelp provisioned, the node that
	// holds its directory: each node watches only its own volumes.
	NodeLabel = "kelp.io/local-path-node"
	// Finalizer keeps a volume whose class said Delete until its node has
	// removed its directory: a volume deleted by hand takes its data with
	// it too, as upstream's provisioners do when they honor the reclaim
	// policy, instead of leaving a directory nobody knows about.
	Finalizer = "kelp.io/local-path"
)

// pvProtection is the finalizer the controller-manager keeps on a volume
// while a claim is bound to it: a volume deleted by hand keeps its data
// until no pod can use it.
const pvProtection = "kubernetes.io/pv-protection"

// hostnameLabel is the node label that volumes' node affinity matches:
// kelp's kubelets set it to the node name (--hostname-override).
const hostnameLabel = "kubernetes.io/hostname"

// volumeName is the name of claim's volume, as upstream provisioners name
// theirs.
func volumeName(claim *corev1.PersistentVolumeClaim) string {
	return "pvc-" + string(claim.UID)
}

// dirName is the name of claim's directory under the storage path, as
// local-path-provisioner names it: whoever looks at the disk sees whose
// data it is. Namespace and claim names cannot hold a slash or be "..".
func dirName(claim *corev1.PersistentVolumeClaim) string {
	return fmt.Sprintf("pvc-%s_%s_%s", claim.UID, claim.Namespace, claim.Name)
}

// ownDir says whether volume's path is the directory kelp made for it,
// and so one kelp may remove: right under root, named for the claim the
// volume was made for (dirName), with the volume named for that claim
// too (volumeName). Whoever may create PersistentVolumes can make one
// that looks like kelp's and point it at any path, another claim's live
// directory included, and a volume's path is the one thing removed with
// it. Volume names are unique: the one that goes with a claim's directory
// is taken by that claim's own volume.
func ownDir(root string, volume *corev1.PersistentVolume) bool {
	ref := volume.Spec.ClaimRef
	if volume.Spec.Local == nil || ref == nil || ref.UID == "" {
		return false
	}
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID}}
	path := volume.Spec.Local.Path
	return volume.Name == volumeName(claim) && filepath.IsAbs(path) && filepath.Clean(path) == path &&
		filepath.Dir(path) == root && filepath.Base(path) == dirName(claim)
}

// refusal says why claim cannot have a local-path volume, or is nil. A
// directory on one node serves one node's pods, as a filesystem.
func refusal(claim *corev1.PersistentVolumeClaim) error {
	for _, m := range claim.Spec.AccessModes {
		if m != corev1.ReadWriteOnce && m != corev1.ReadWriteOncePod {
			return fmt.Errorf("access mode %s is not supported: a local-path volume lives on one node; ask for ReadWriteOnce or ReadWriteOncePod, or use a storage class that serves %[1]s", m)
		}
	}
	if claim.Spec.VolumeMode != nil && *claim.Spec.VolumeMode != corev1.PersistentVolumeFilesystem {
		return fmt.Errorf("volume mode %s is not supported: a local-path volume is a directory; ask for volumeMode Filesystem", *claim.Spec.VolumeMode)
	}
	if claim.Spec.Selector != nil {
		return errors.New("a selector is not supported: a provisioned volume has no labels to match; remove the selector")
	}
	if claim.Spec.DataSource != nil || claim.Spec.DataSourceRef != nil {
		return errors.New("a data source is not supported: local-path volumes start empty; remove dataSource and dataSourceRef")
	}
	return nil
}

// volumeFor is the PersistentVolume that gives claim, of class, the
// directory path on node. Its capacity is what the claim asked for: it is
// reported, not enforced, as the directory shares its filesystem.
func volumeFor(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, node, path string) *corev1.PersistentVolume {
	reclaim := corev1.PersistentVolumeReclaimDelete
	if class.ReclaimPolicy != nil {
		reclaim = *class.ReclaimPolicy
	}
	var finalizers []string
	if reclaim == corev1.PersistentVolumeReclaimDelete {
		finalizers = []string{Finalizer}
	}
	filesystem := corev1.PersistentVolumeFilesystem
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:       volumeName(claim),
			Labels:     map[string]string{NodeLabel: node},
			Finalizers: finalizers,
			// The controller-manager's binder leaves the deletion of a
			// volume provisioned by an external provisioner to it.
			Annotations: map[string]string{storagehelpers.AnnDynamicallyProvisioned: Provisioner},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: claim.Spec.Resources.Requests[corev1.ResourceStorage]},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: path}},
			AccessModes:                   claim.Spec.AccessModes,
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID},
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              class.Name,
			VolumeMode:                    &filesystem,
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
}

// wantsVolume says whether claim waits for this node to provision it: the
// scheduler placed it on node, and the binder found no volume for it and
// handed it to Provisioner.
func wantsVolume(claim *corev1.PersistentVolumeClaim, node string) bool {
	a := claim.Annotations
	return claim.Spec.VolumeName == "" && claim.DeletionTimestamp == nil && a[storagehelpers.AnnSelectedNode] == node &&
		(a[storagehelpers.AnnStorageProvisioner] == Provisioner || a[storagehelpers.AnnBetaStorageProvisioner] == Provisioner)
}

// toDelete says whether volume, one of this node's, is one kelp deletes:
// its claim is gone and its class said Delete, or it was deleted by hand
// and no claim holds it any more.
func toDelete(volume *corev1.PersistentVolume) bool {
	if volume.Annotations[storagehelpers.AnnDynamicallyProvisioned] != Provisioner {
		return false
	}
	if volume.DeletionTimestamp != nil {
		return slices.Contains(volume.Finalizers, Finalizer) && !slices.Contains(volume.Finalizers, pvProtection)
	}
	return volume.Status.Phase == corev1.VolumeReleased && volume.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete
}
