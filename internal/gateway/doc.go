// Package gateway is kelp's Gateway API implementation: Compile turns
// GatewayClasses, Gateways, HTTPRoutes, ReferenceGrants, Services, Secrets
// and Namespaces into the configuration of a data path and the status of
// every object; the server's Controller writes that status and publishes
// the configuration as one Secret, which the data path (Serve) on every
// node reads and serves: HTTP and HTTPS listeners, routing, and proxying to
// the Services' ready endpoints. The Gateways' own addresses (from the
// server's --gateway-address-range) are each held by the one node the
// configuration names, on its interface on the address's network.
package gateway
