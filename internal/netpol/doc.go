// Package netpol enforces Kubernetes NetworkPolicies for the pods of one
// node (in place of a policy agent such as kube-router or Calico). It
// watches policies, pods and namespaces and programs one nftables table
// of family inet, for IPv4 and IPv6 alike, on the forward hook: the pod
// at each end of a packet is found with a verdict map, so the cost per
// packet grows only with the rules of the policies that select that pod,
// not with the number of pods or policies on the node.
package netpol
