// Package controllermanager runs the upstream kube-controller-manager
// in-process with flags built from kelp's configuration.
package controllermanager
