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
package datastore
