// Package witness runs `kelp witness`: a voting member of a cluster's
// embedded etcd and nothing else (no apiserver, kubelet or containerd), the
// third vote that lets two servers lose either one and keep their quorum.
// It joins once through a server's join API with the server token, gets
// its etcd certificates (and no CA key), starts as a learner, and votes
// once a server has promoted it. Its etcd member is named witness/<name>,
// which no Node's deletion removes. `kelp witness status` reads its state
// on the witness itself.
package witness
