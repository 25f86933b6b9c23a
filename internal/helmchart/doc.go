// Package helmchart installs Helm charts described by HelmChart objects
// (helm.cattle.io/v1, the API k3s users already write), in the kelp server
// itself with the Helm SDK: no helm-install Job, no image, so it works on a
// cluster that reaches no registry.
//
// A chart comes from spec.chartContent (a base64 .tgz, for airgap), from a
// chart repository (spec.repo with spec.chart and spec.version), or from a
// URL, which may name a .tgz dropped into the server's static charts
// directory as https://%{KUBERNETES_API}%/static/charts/NAME.tgz; the
// server serves that directory (StaticHandler) and Run fetches it with the
// admin credentials.
//
// The controller runs kelp's reconcile loop: each pass hands the HelmCharts
// that have work to a few workers, since an install can take minutes
// (hooks), and holds back each failed one with its own backoff. A chart has
// work only when its spec's hash differs from the one its status records
// as deployed: an idle cluster costs no datastore writes and no chart
// downloads. A finalizer
// keeps a HelmChart until its release is uninstalled.
package helmchart
