// Package component runs long-lived pieces of kelp in goroutines with the
// lifecycle every piece shares: start, wait until ready, report a later
// failure, stop with a deadline.
package component
