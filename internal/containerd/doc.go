// Package containerd runs containerd and ctr from the kelp binary, and
// supervises containerd as a child process of the node. Its runc shim is a
// binary of the bundle.
package containerd
