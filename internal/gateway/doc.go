// Package gateway is kelp's Gateway API implementation: Compile turns
// GatewayClasses, Gateways, HTTPRoutes, ReferenceGrants, Services, Secrets
// and Namespaces into the configuration of a data path and the status of
// every object; the server's Controller writes that status and publishes
// the configuration as one Secret, which the data path (Serve) on every
// node reads and serves: HTTP and HTTPS listeners, routing, and proxying to
// the Services' ready endpoints.
package gateway
