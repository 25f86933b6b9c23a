// Package images loads image tarballs into containerd: the bundled pause
// image and the airgap images directory, whose images are pinned so that
// the kubelet's image garbage collection never removes them.
package images
