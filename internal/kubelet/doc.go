// Package kubelet runs the upstream kubelet in-process, from a generated
// KubeletConfiguration file and a command line built by Args.
package kubelet
