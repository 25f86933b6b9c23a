// Package localstorage provisions local-path volumes: directories on the
// node that runs the pod, in the place of Rancher's local-path-provisioner
// but without its helper pods and image. Every node runs its own
// provisioner, which serves only the claims the scheduler placed on it.
//
// The StorageClass binds on first consumer, so the scheduler picks the
// node and writes it on the claim (volume.kubernetes.io/selected-node);
// the controller-manager's volume binder, seeing an external provisioner,
// marks the claim for it (volume.kubernetes.io/storage-provisioner). The
// node's provisioner then makes the directory and a local
// PersistentVolume, pinned to the node, that names the claim; the binder
// binds the two. When such a volume is Released and its reclaim policy is
// Delete, the node that holds it removes the directory it made for that
// volume, and the volume; a volume that points elsewhere keeps its path.
package localstorage
