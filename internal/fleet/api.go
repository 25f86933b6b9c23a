package fleet

import (
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The Upgrade kind.
const (
	Group   = "kelp.io"
	Version = "v1"
	Kind    = "Upgrade"
	crdName = "upgrades." + Group
)

// Resource is the Upgrades' resource.
var Resource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "upgrades"}

// Node annotations. The controller asks by RequestAnnotation; the node's
// controllers answer under ReportPrefix, the only keys of its Node they
// may change besides the overlay's (systemobjects' nodes policy).
const (
	// RequestAnnotation is <upgrade>/<sha256>: the node is to run that
	// binary.
	RequestAnnotation = "kelp.io/upgrade"
	// ReportPrefix starts the annotations a node writes on its own Node.
	ReportPrefix = "upgrade.kelp.io/"
	// VersionAnnotation is the kelp the node runs, set at each start.
	VersionAnnotation = ReportPrefix + "running"
	// ResultAnnotation is a Result: what became of the last upgrade the
	// node was asked for.
	ResultAnnotation = ReportPrefix + "result"
)

// Defaults of an Upgrade's spec.
const (
	defaultConcurrency  = 1
	defaultDrainTimeout = 5 * time.Minute
	defaultNodeTimeout  = 15 * time.Minute
	// defaultMaxSize is well above a kelp binary (189 MiB on amd64) and
	// below what a small node's disk should give a download.
	defaultMaxSize = "512Mi"
)

// Phases of an Upgrade.
const (
	PhasePending   = "Pending"
	PhaseUpgrading = "Upgrading"
	PhaseSucceeded = "Succeeded"
	PhaseFailed    = "Failed"
)

// States of a node in an Upgrade's status.
const (
	StatePending   = "Pending"
	StateDraining  = "Draining"
	StateUpgrading = "Upgrading"
	StateSucceeded = "Succeeded"
	StateFailed    = "Failed"
)

// Upgrade is what an Upgrade object holds.
type Upgrade struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`
}

// Spec names the new kelp and how to roll it out.
type Spec struct {
	// SHA256 is the new binary's checksum, in hex.
	SHA256 string `json:"sha256"`
	// URL (https, or http with AllowHTTP) is where each node fetches the
	// binary.
	URL string `json:"url,omitempty"`
	// AllowHTTP lets URL be plain http. The sha256 still decides what
	// runs, but anyone on the path could then watch the fetch or feed
	// every node up to MaxSize of garbage, so it is asked for by name.
	AllowHTTP bool `json:"allowHTTP,omitempty"`
	// MaxSize is the most a node reads of the new kelp, from URL or Path
	// (a quantity such as 512Mi), so a wrong or hostile URL cannot fill
	// the node's disk.
	MaxSize string `json:"maxSize,omitempty"`
	// Path is a file already on every node instead: a name in
	// <data-dir>/agent/upgrades, or an absolute path in it.
	Path string `json:"path,omitempty"`
	// Concurrency is how many agents are upgraded at once; servers are
	// always one at a time.
	Concurrency int `json:"concurrency,omitempty"`
	// DrainTimeout bounds the drain of one node (a Go duration).
	DrainTimeout string `json:"drainTimeout,omitempty"`
	// NodeTimeout bounds the wait for one node to run the new kelp,
	// boot guard retries included (a Go duration).
	NodeTimeout string `json:"nodeTimeout,omitempty"`
}

// Status is how the rollout goes.
type Status struct {
	Phase string       `json:"phase,omitempty"`
	Nodes []NodeStatus `json:"nodes,omitempty"`
	// Target is the new kelp, from its --version.
	Target     string             `json:"target,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeStatus is one node's part of the rollout.
type NodeStatus struct {
	Name        string       `json:"name"`
	Server      bool         `json:"server,omitempty"`
	State       string       `json:"state"`
	Message     string       `json:"message,omitempty"`
	FromVersion string       `json:"fromVersion,omitempty"`
	ToVersion   string       `json:"toVersion,omitempty"`
	Since       *metav1.Time `json:"since,omitempty"`
}

// Result is what a node reports of the upgrade it was asked for.
type Result struct {
	// Request is the RequestAnnotation it answers.
	Request string `json:"request"`
	OK      bool   `json:"ok"`
	// Running is the kelp the node runs after it.
	Running string `json:"running,omitempty"`
	Message string `json:"message,omitempty"`
}

// ParseResult reads a ResultAnnotation; ok is false when there is none or
// it cannot be read.
func ParseResult(s string) (Result, bool) {
	var r Result
	if s == "" || json.Unmarshal([]byte(s), &r) != nil {
		return Result{}, false
	}
	return r, true
}

func (r Result) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// Request is the RequestAnnotation for the upgrade.
func (u *Upgrade) Request() string { return u.Name + "/" + strings.ToLower(u.Spec.SHA256) }

var sha256Hex = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// Validate checks the spec, with the defaults it leaves out filled in.
func (s Spec) Validate() (Spec, error) {
	if !sha256Hex.MatchString(s.SHA256) {
		return s, fmt.Errorf("spec.sha256 %q is not a sha256 in hex (64 characters): give the output of sha256sum on the new kelp", s.SHA256)
	}
	switch {
	case s.URL == "" && s.Path == "":
		return s, fmt.Errorf("give the new kelp's spec.url (https, fetched by each node) or spec.path (a file already on every node in <data-dir>/agent/upgrades)")
	case s.URL != "" && s.Path != "":
		return s, fmt.Errorf("give spec.url or spec.path, not both")
	case s.URL != "":
		u, err := url.Parse(s.URL)
		switch {
		case err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http"):
			return s, fmt.Errorf("spec.url %q is not an https URL", s.URL)
		case u.Scheme == "http" && !s.AllowHTTP:
			return s, fmt.Errorf("spec.url %q is plain http, which anyone on the way can watch and answer: serve the file over https, or set spec.allowHTTP: true to fetch it anyway (the sha256 still decides what runs)", s.URL)
		}
	case s.Path != "" && !filepath.IsAbs(s.Path) && (strings.Contains(s.Path, "/") || s.Path == "." || s.Path == ".."):
		return s, fmt.Errorf("spec.path %q is neither a file name in <data-dir>/agent/upgrades nor an absolute path in it", s.Path)
	}
	if s.MaxSize == "" {
		s.MaxSize = defaultMaxSize
	}
	if q, err := resource.ParseQuantity(s.MaxSize); err != nil || q.Sign() <= 0 {
		return s, fmt.Errorf("spec.maxSize %q is not a size like %s", s.MaxSize, defaultMaxSize)
	}
	if s.Concurrency < 0 {
		return s, fmt.Errorf("spec.concurrency %d: give 1 or more", s.Concurrency)
	}
	if s.Concurrency == 0 {
		s.Concurrency = defaultConcurrency
	}
	for _, d := range []struct {
		name  string
		value *string
		def   time.Duration
	}{{"drainTimeout", &s.DrainTimeout, defaultDrainTimeout}, {"nodeTimeout", &s.NodeTimeout, defaultNodeTimeout}} {
		if *d.value == "" {
			*d.value = d.def.String()
			continue
		}
		if v, err := time.ParseDuration(*d.value); err != nil || v <= 0 {
			return s, fmt.Errorf("spec.%s %q is not a duration like 5m", d.name, *d.value)
		}
	}
	return s, nil
}

// durations of a validated spec.
func (s Spec) drainTimeout() time.Duration { d, _ := time.ParseDuration(s.DrainTimeout); return d }
func (s Spec) nodeTimeout() time.Duration  { d, _ := time.ParseDuration(s.NodeTimeout); return d }

// maxSize of a validated spec, in bytes.
func (s Spec) maxSize() int64 { q, _ := resource.ParseQuantity(s.MaxSize); return q.Value() }

// ResolvePath is where a node whose data dir's upgrades directory is dir
// finds the spec's path; a path outside dir is refused.
func ResolvePath(dir, path string) (string, error) {
	if !filepath.IsAbs(path) {
		return filepath.Join(dir, path), nil
	}
	clean := filepath.Clean(path)
	if rel, err := filepath.Rel(dir, clean); err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("spec.path %s is not in this node's %s: put the new kelp there (or give its name only)", path, dir)
	}
	return clean, nil
}

func fromUnstructured(obj *unstructured.Unstructured) (*Upgrade, error) {
	var u Upgrade
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &u); err != nil {
		return nil, fmt.Errorf("read Upgrade %s: %w", obj.GetName(), err)
	}
	return &u, nil
}

func toUnstructured(u *Upgrade) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(u)
	if err != nil {
		return nil, err
	}
	obj := &unstructured.Unstructured{Object: m}
	obj.SetAPIVersion(Group + "/" + Version)
	obj.SetKind(Kind)
	return obj, nil
}

// node returns the status of the node name, or nil.
func (s *Status) node(name string) *NodeStatus {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i]
		}
	}
	return nil
}
