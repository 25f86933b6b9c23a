// Package server composes the kelp server role: PKI, datastore and the
// Kubernetes control plane, started in dependency order and stopped in
// reverse.
//
// start computes what the pieces share once, in an env (env.go): the
// paths, the certificates, the admin's clients and the datastore. The
// pieces after the apiserver are rows of controlPlane and controllers
// (parts.go), each with its own enabled(env): a new built-in part is a
// row, not a guarded block.
package server
