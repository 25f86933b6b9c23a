// Package joinapi is the part of the server that nodes join through. It
// is served by the apiserver itself, on its port, beside the Kubernetes
// API: /cacerts and /ping answer anyone (a joining node pins the CA by the
// hash in its token), and /v1-kelp/join gives a node that presents a valid
// token its certificates and the cluster's settings. A node that joined
// renews its certificates there too, with its client certificate instead
// of a token. An address that keeps presenting wrong tokens is made to
// wait, and logged sparingly.
//
// A joining node fetches /cacerts and keeps of it only the certificate its
// token's hash names (during a CA rotation also the CAs that certificate
// signed); it sends the secret only over a connection that CA verifies,
// follows no redirect, and from then on trusts that CA, not the bundle.
//
// Wrong tokens are counted per source (an address; of IPv6 a /64) and
// token id (the public half of a bootstrap token; the server and agent
// tokens count as one id), so that behind a NAT one machine with a stale
// token holds up only joins of its own id; a second count over all ids
// keeps a guesser from gaining by making ids up (limit.go).
package joinapi
