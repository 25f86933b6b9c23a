// Package snapshot saves, lists, prunes and restores snapshots of a server's
// own datastore: SQLite through an online VACUUM INTO, embedded etcd through
// etcd's snapshot API. Each snapshot file has a JSON sidecar, <name>.json,
// that says what it is and holds its checksum; a snapshot without a valid
// sidecar is incomplete and is never restored or counted as kept.
package snapshot
