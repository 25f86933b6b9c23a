// Package server composes the kelp server role: PKI, datastore and the
// Kubernetes control plane, started in dependency order and stopped in
// reverse.
package server
