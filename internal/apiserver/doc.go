// Package apiserver runs the upstream kube-apiserver in-process with flags
// built from kelp's configuration.
package apiserver
