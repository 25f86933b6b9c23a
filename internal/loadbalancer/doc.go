// Package loadbalancer is an agent's client-side load balancer: a TCP
// proxy on loopback that the node's own components (kubelet, proxy, DNS,
// controllers) reach the apiserver through. It knows every server and
// forwards each connection to one that answers, so that the node's
// kubeconfigs never change when a server goes away or a new one joins.
package loadbalancer
