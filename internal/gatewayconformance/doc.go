// Package gatewayconformance runs the upstream Gateway API conformance
// suite (the Go module sigs.k8s.io/gateway-api/conformance, as its docs
// say) against a kelp node, and writes the suite's report. It holds tests
// only, so that the suite and its dependencies (controller-runtime among
// them) stay out of the kelp binary.
//
// TestGatewayConformance runs only when KELP_GATEWAY_CONFORMANCE=1:
// scripts/gateway-conformance.sh builds kelp, runs it and prints the
// report; scripts/test.sh does not run it.
package gatewayconformance
