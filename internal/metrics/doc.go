// Package metrics serves the resource metrics API (metrics.k8s.io/v1beta1)
// from inside the server, for `kubectl top` and the HorizontalPodAutoscaler,
// with nothing to pull or deploy: the part of metrics-server those two use.
//
// Every 15 s a Scraper reads each Ready node's kubelet at
// /metrics/resource, in parallel and with a timeout. It goes to the
// kubelet directly, with the apiserver's kubelet client certificate, not
// through the apiserver's node proxy: the reach is the same (the apiserver
// runs in this process), without a second TLS hop, an authorization check
// and an audit log entry per node and round. Parse turns the Prometheus text into
// cumulative CPU times and working sets, and the Store keeps, in memory
// only, the last reading of each node and the usage between it and the one
// before (CPU as the rate between their timestamps). A node that does not
// answer is reported once, and its figures are dropped after two missed
// scrapes; the others are not held up.
//
// API answers the metrics.k8s.io requests the apiserver's aggregator
// forwards to it, over TLS with a serving certificate signed at start by
// the server CA, and only to clients holding a certificate of the
// front-proxy CA. Start ties them together and publishes this server's
// address as an EndpointSlice of the Service kube-system/metrics-server,
// which the APIService v1beta1.metrics.k8s.io (applied from
// embed/manifests/metrics-server.yaml) points at.
package metrics
