// Package joinapi is the part of the server that nodes join through. It
// is served by the apiserver itself, on its port, beside the Kubernetes
// API: /cacerts and /ping answer anyone (a joining node pins the CA by the
// hash in its token), and /v1-kelp/join gives a node that presents a valid
// token its certificates and the cluster's settings. A node that joined
// renews its certificates there too, with its client certificate instead
// of a token. An address that keeps presenting wrong tokens is made to
// wait, and logged sparingly.
package joinapi
