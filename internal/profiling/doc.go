// Package profiling serves Go's runtime profiles (net/http/pprof) of the
// whole kelp process on a loopback address, for `go tool pprof`: where the
// memory of the in-process control plane and node goes, and what wakes an
// idle node up. Off unless --pprof-address asks for it.
package profiling
