// Package bootguard keeps an upgrade from bricking a node no one can reach.
// A start of a kelp other than the one that last became ready on the data
// dir is an upgrade on trial: its starts are counted in the data dir,
// written before anything else happens, so that a crash or a kill counts
// too, and the count is cleared once it is ready. After a number of starts
// in a row that did not become ready, kelp rolls the node back: the
// datastore of a single server that the new kelp opened is restored from
// the snapshot taken before the upgrade (unless its apiserver took a write
// from a client other than kelp's own, which the restore would undo: see
// Guard.WriteWatch), and kelp.previous, beside the
// running binary, takes its place in one rename. The process then exits
// non-zero, so the service manager starts the previous kelp.
package bootguard
