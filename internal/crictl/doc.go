// Package crictl is a small crictl: it lists, inspects, follows and
// cleans up the pods, containers and images of kelp's containerd through
// the CRI, the kubelet's view, with crictl's command names, flags and
// output shapes for the common cases. (The cri-tools module is not
// available from the Go module proxy kelp builds with, so kelp carries
// the subset runbooks use itself.)
package crictl
