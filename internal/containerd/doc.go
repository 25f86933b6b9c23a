// Package containerd renders the configuration of a node's containerd and
// supervises it as a child process, and runs ctr from the kelp binary.
// containerd itself and its runc shim are binaries of the bundle
// (scripts/bundle/containerd): kelp's package initialisation would cost
// every process started from the kelp binary some 80 MiB.
package containerd
