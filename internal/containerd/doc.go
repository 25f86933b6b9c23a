// Package containerd runs containerd and its runc shim from the kelp binary
// and supervises containerd as a child process of the node.
package containerd
