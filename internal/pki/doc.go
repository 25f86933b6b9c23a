// Package pki creates and refreshes the cluster's certificate authorities,
// leaf certificates and service-account signing key under
// <data-dir>/server/tls.
//
// Ensure runs at every server start. Certificate authorities and the
// service-account key are created once and never replaced, because every
// node, kubeconfig and token in the cluster trusts them; when one is damaged
// Ensure stops with an error that says which file and what to do. Leaf
// certificates are cheap and are reissued whenever they are close to expiry
// or no longer match what the node needs, and are otherwise left untouched.
// Renew does the same for leaves while the server runs (package certrenew
// calls it); NextExpiry says when the first of some leaves is due.
//
// The kubelets' serving certificates come from a CA of their own, which
// only the kubelets' clients trust, and name only their node
// (CheckKubeletSANs): see kubelet.go.
//
// IssueNode signs the credentials of a node that joins, which travel as
// PEMPairs (contents) and land, by NodeFiles.Write (NodeFiles.WriteRenewed
// on a running node), at Pairs (paths).
// PinnedCA says what a join token's CA hash vouches for in the CA bundle
// a server serves, during a CA rotation too (see RotateCA).
// IssueServing signs, in memory, the certificate of a server that makes a
// new one at every start (the metrics API).
// internal/layout says where the TLS directories are; the names of the
// files in them are spelled here only, in FilesIn and NodeFilesIn.
package pki
