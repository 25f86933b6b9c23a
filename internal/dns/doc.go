// Package dns serves cluster DNS on every node from an embedded CoreDNS,
// bound to the cluster DNS address on the node itself: a pod's queries
// never leave its node, and answers keep coming from the cache while the
// server is away.
package dns
