package helmchart

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Resource is the HelmChart API, the one k3s defines, so that manifests
// written for k3s work unchanged.
var Resource = schema.GroupVersionResource{Group: "helm.cattle.io", Version: "v1", Resource: "helmcharts"}

// Finalizer keeps a HelmChart until its release is uninstalled.
const Finalizer = "kelp.io/helm-chart"

// ConditionDeployed is True once the release of the current spec is
// deployed; False says why it is not, in its reason and message.
const ConditionDeployed = "Deployed"

// Reasons of the Deployed condition.
const (
	ReasonInstalled        = "Installed"
	ReasonUpgraded         = "Upgraded"
	ReasonChartUnavailable = "ChartUnavailable" // not found, repository unreachable
	ReasonChartInvalid     = "ChartInvalid"     // not a chart archive
	ReasonValuesInvalid    = "ValuesInvalid"    // valuesContent or set unreadable
	ReasonSpecInvalid      = "SpecInvalid"      // another field unreadable
	ReasonInstallFailed    = "InstallFailed"    // Helm refused or failed: rendering, the apiserver
	ReasonUninstallFailed  = "UninstallFailed"
)

// Spec is what the controller reads of a HelmChart's spec. The CRD accepts
// more of k3s's fields (jobImage, helmVersion, …) so that k3s manifests
// apply; they mean nothing without a helm-install Job.
type Spec struct {
	// Chart is a chart name in Repo, or a URL of a chart archive; unused
	// with ChartContent.
	Chart   string `json:"chart,omitempty"`
	Repo    string `json:"repo,omitempty"`
	Version string `json:"version,omitempty"`
	// RepoCA is PEM certificates the repository's (or the chart URL's)
	// certificate may chain to, beside the system's.
	RepoCA                string `json:"repoCA,omitempty"`
	InsecureSkipTLSVerify bool   `json:"insecureSkipTLSVerify,omitempty"`
	// ChartContent is a base64 chart archive; it wins over Chart.
	ChartContent string `json:"chartContent,omitempty"`
	// TargetNamespace is the release's namespace; empty: the HelmChart's.
	TargetNamespace string `json:"targetNamespace,omitempty"`
	CreateNamespace bool   `json:"createNamespace,omitempty"`
	// ValuesContent is values YAML; Set overrides it key by key, the way
	// `helm --set` overrides `--values`.
	ValuesContent string                     `json:"valuesContent,omitempty"`
	Set           map[string]json.RawMessage `json:"set,omitempty"`
	// Timeout bounds Helm's waits for hooks: a Go duration ("300s",
	// "5m"); empty is 5 minutes.
	Timeout       string `json:"timeout,omitempty"`
	TakeOwnership bool   `json:"takeOwnership,omitempty"`
}

// Status is what the controller writes of a HelmChart's status.
type Status struct {
	// SpecHash is the Hash of the spec the conditions speak of.
	SpecHash string `json:"specHash,omitempty"`
	// Revision and ChartVersion are those of the release last deployed.
	Revision     int                `json:"revision,omitempty"`
	ChartVersion string             `json:"chartVersion,omitempty"`
	Conditions   []metav1.Condition `json:"conditions,omitempty"`
}

// Hash identifies what a spec asks for: a HelmChart whose status records
// this hash as deployed needs nothing done. Fields the controller does not
// read leave it unchanged.
func (s Spec) Hash() string {
	// It cannot fail: Set's raw values were decoded from JSON. Maps
	// marshal with their keys sorted.
	b, _ := json.Marshal(s)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// timeout is how long Helm waits for hooks.
func (s Spec) timeout() (time.Duration, error) {
	if s.Timeout == "" {
		return defaultTimeout, nil
	}
	d, err := time.ParseDuration(s.Timeout)
	if err != nil || d <= 0 {
		return 0, &failure{reason: ReasonSpecInvalid, final: true, err: fmt.Errorf("spec.timeout %q is not a positive duration such as 300s or 5m", s.Timeout)}
	}
	return d, nil
}

// helmChart is the part of a HelmChart object the controller works with.
type helmChart struct {
	metav1.ObjectMeta
	Spec   Spec
	Status Status
}

// decode reads obj (a HelmChart from the dynamic client) into a helmChart.
func decode(obj *unstructured.Unstructured) (helmChart, error) {
	var hc struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
		Spec     Spec              `json:"spec"`
		Status   Status            `json:"status"`
	}
	b, err := obj.MarshalJSON()
	if err == nil {
		err = json.Unmarshal(b, &hc)
	}
	if err != nil {
		return helmChart{}, fmt.Errorf("read HelmChart %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return helmChart{ObjectMeta: hc.Metadata, Spec: hc.Spec, Status: hc.Status}, nil
}

// deployed says whether the release of the current spec is deployed.
func (hc helmChart) deployed() bool {
	return hc.Status.SpecHash == hc.Spec.Hash() && meta.IsStatusConditionTrue(hc.Status.Conditions, ConditionDeployed)
}

// releaseNamespace is where the release and the chart's objects go.
func (hc helmChart) releaseNamespace() string {
	if hc.Spec.TargetNamespace != "" {
		return hc.Spec.TargetNamespace
	}
	return hc.Namespace
}
