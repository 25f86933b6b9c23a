// Package datastore runs the storage backend that kube-apiserver talks to.
//
// Which backend runs depends on Config:
//
//   - no endpoint: kine on SQLite at <data-dir>/server/db/state.db, served on a
//     unix socket;
//   - postgres:// or mysql:// endpoint: kine on that database, served on the same
//     unix socket;
//   - http(s):// endpoint: an external etcd, passed through to the apiserver;
//   - ClusterInit: an embedded etcd at <data-dir>/server/db/etcd with client and
//     peer TLS.
//
// Start launches the backend, Ready and WaitReady report when it really answers
// etcd requests, Err reports a later failure and Stop stops it. Nothing in this
// package deletes or rewrites existing data to recover from an error: a datastore
// that cannot be opened fails with an error that says what to do.
//
// On SQLite, Leases and Events live apart, in a RAM store (ramstore.go): a
// second kine on a SQLite file in a tmpfs, which the apiserver reaches
// through --etcd-servers-overrides. At idle nearly every write a cluster
// makes is a Lease renewal, which would otherwise wear an SD card every few
// seconds for data nobody needs after a reboot. Only SQLite gets one:
// embedded etcd and external datastores are shared by several servers, and
// a Lease must be one object for every apiserver, or two controllers could
// hold the same leader lock and a node look dead to one server and alive to
// another; their writes do not wear this machine's flash either (etcd's
// copy per server is the price of HA, an external database's disks are
// elsewhere). A new RAM store starts its revisions at the time in
// microseconds, above any an earlier one reached, so watchers list again.
//
// A new SQLite datastore gets 1 KiB pages instead of 4 KiB: a small update
// then writes about 24 KB (WAL frames and their checkpoint) instead of 46
// KB, at the price of slower reads of large objects from the datastore
// rather than the watch cache (go test -bench 'SQLite(Writes|Reads)').
//
// kine's timer compaction is off: the apiserver compacts (every 5 minutes)
// and kine keeps the last 1000 revisions. kine answers a paginated LIST by
// copying every row of the rest of the range before it sorts and cuts a
// page, and counts the rest again, so a whole list in pages costs the
// square of its size when the apiserver's watch cache does not answer it
// (bench-scale.sh: 41.6 s for 50,000 objects); no SQLite setting changes
// that (go test -bench SQLiteReads).
package datastore
