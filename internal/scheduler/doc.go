// Package scheduler runs the upstream kube-scheduler in-process with flags
// built from kelp's configuration.
package scheduler
