// Package nodeaddress sets the addresses of the cluster's nodes,
// ExternalIP included, which a kubelet alone cannot report. The kubelets
// run with --cloud-provider=external and the server runs upstream's cloud
// node controller with a provider that has no cloud, only what the nodes
// say of themselves: InternalIP from --node-ip (the kubelet's
// provided-node-ip annotation), ExternalIP from --node-external-ip (an
// annotation the node puts on itself) and the hostname.
package nodeaddress
