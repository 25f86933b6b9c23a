// Package certrenew keeps a running server's and node's leaf certificates
// renewed, without a restart: a Loop looks at them at least hourly and
// renews them once the first is due (the last third of its life, see
// pki), through pki on a server and through the join API on a node that
// joined one.
//
// Renewing writes new files; every reader follows them on its own. The
// apiserver (serving, aggregator proxy client), the kubelet (serving) and
// embedded etcd reload their files; client-go, which every Kubernetes
// client in kelp is, reloads a client certificate it was given by file
// (kubeconfig.WriteLocal) on each new connection and looks for a change every
// few minutes (SpeedUpClientReload). A CA is never renewed here.
package certrenew
