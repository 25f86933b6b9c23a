// Package gatewayconformance runs the upstream Gateway API conformance
// suite (the Go module sigs.k8s.io/gateway-api/conformance, as its docs
// say) against a kelp node, and writes the suite's report. It holds tests
// only, so that the suite and its dependencies (controller-runtime among
// them) stay out of the kelp binary.
//
// TestGatewayConformance runs when KELP_GATEWAY_CONFORMANCE=1 (the suite
// takes longer than the rest of the cluster tests allow):
// scripts/gateway-conformance.sh builds kelp, runs it and prints the
// report.
package gatewayconformance
