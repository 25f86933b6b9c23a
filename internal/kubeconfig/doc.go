// Package kubeconfig writes kubeconfig files for kelp's clients.
package kubeconfig
