// Package gatewayconformance runs the upstream Gateway API conformance
// suite (the Go module sigs.k8s.io/gateway-api/conformance, as its docs
// say) against a kelp node, and writes the suite's report. It holds tests
// only, so that the suite and its dependencies (controller-runtime among
// them) stay out of the kelp binary.
//
// TestGatewayConformance runs only when KELP_GATEWAY_CONFORMANCE=1, as
// scripts/test.sh and scripts/gateway-conformance.sh set it; the latter
// builds kelp, runs the test alone and prints the report.
package gatewayconformance
