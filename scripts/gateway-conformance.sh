#!/usr/bin/env bash
# Runs the upstream Gateway API conformance suite (the Go module
# sigs.k8s.io/gateway-api/conformance, profile GATEWAY-HTTP) against a kelp
# server with its node, and prints the suite's report. Builds kelp first
# (scripts/build.sh) unless KELP names a binary. The suite runs as the test
# TestGatewayConformance (internal/gatewayconformance), inside the node's
# namespaces, with the images its manifests name built from source and
# loaded through the node's airgap images directory.
#
# Usage: scripts/gateway-conformance.sh [SUITE FLAGS...]   (as root)
#   SUITE FLAGS   the suite's own, e.g. -run-test=HTTPRouteSimpleSameNamespace,
#                 -skip-tests=A,B, -supported-features=Gateway,HTTPRoute,...
#                 (default: those the GatewayClass kelp says it supports),
#                 -debug
#   REPORT=gateway-conformance-report.yaml   where the report is written
#   KELP=         a kelp binary to test instead of building bin/kelp
#   TIMEOUT=60m   for the whole run, the node's start included
set -euo pipefail
die() { echo "gateway-conformance: $*" >&2; exit 1; }
REPORT=$(readlink -m "${REPORT:-gateway-conformance-report.yaml}")
TIMEOUT=${TIMEOUT:-60m}
cd "$(dirname "$0")/.."

[[ $(id -u) == 0 ]] || die "run as root (the node runs in namespaces of its own)"
[[ $TIMEOUT =~ ^[1-9][0-9]*[hm]$ ]] || die "TIMEOUT=$TIMEOUT: give minutes or hours, e.g. 60m"
if [[ -n ${KELP:-} ]]; then
  KELP=$(readlink -f "$KELP")
  [[ -x $KELP ]] || die "KELP=$KELP is not an executable kelp binary"
else
  scripts/build.sh
  KELP=$PWD/bin/kelp
fi
rm -f "$REPORT"

# The same build as kelp's (its patches to upstream modules), sharing the
# build cache with scripts/build.sh and scripts/test.sh.
modfile=$(scripts/patches.sh .cache/patched)
rc=0
CGO_ENABLED=0 KELP_BIN=$KELP KELP_GATEWAY_CONFORMANCE=1 KELP_GATEWAY_CONFORMANCE_REPORT=$REPORT \
  go test -modfile="$modfile" -count=1 -timeout "$TIMEOUT" -v -run '^TestGatewayConformance$' \
  ./internal/gatewayconformance/ -args "$@" || rc=$?

[[ -f $REPORT ]] || die "the suite wrote no report (exit status $rc): see above"
echo
echo "==== Gateway API conformance report: $REPORT"
cat "$REPORT"
exit "$rc"
