// Package hostcheck inspects the kernel and the host for what a kelp node
// needs, and says how to fix what is missing. `kelp check-config` prints
// the whole report; `kelp server` refuses to start on a failure.
package hostcheck
