// Package agent composes a kelp node: containerd, the kubelet, images and
// the pod network. `kelp server` runs one beside its control plane.
package agent
