// Package kubeconfig writes kubeconfig files for kelp's clients, and makes
// the client configuration of such a file for a client in this process.
package kubeconfig
