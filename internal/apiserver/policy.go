package apiserver

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// Audit is where the apiserver logs requests; off when LogPath is empty.
type Audit struct {
	LogPath string
	// PolicyFile says what is logged; kelp's default (WriteDefaultAuditPolicy)
	// unless the user gave one.
	PolicyFile                        string
	MaxSizeMB, MaxBackups, MaxAgeDays int
}

// defaultAuditPolicy logs who did what to which object, never the bodies:
// Secrets, ConfigMaps and tokens would otherwise land in the log in the
// clear. The steady chatter of leases, events and health checks is left
// out so that an idle cluster writes nothing.
const defaultAuditPolicy = `# Written by kelp at every start; give --audit-policy-file to use your own.
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  resources:
  - group: coordination.k8s.io
    resources: [leases]
  - group: ""
    resources: [events]
- level: None
  nonResourceURLs: [/healthz*, /livez*, /readyz*, /version, /openapi*]
- level: None
  verbs: [get, list, watch]
  userGroups: [system:nodes, system:serviceaccounts:kube-system]
- level: Metadata
`

// WriteDefaultAuditPolicy writes kelp's audit policy to path.
func WriteDefaultAuditPolicy(path string) error {
	return writeConfig(path, defaultAuditPolicy)
}

// PodSecurity is what Pod Security admission does to a pod in a
// namespace without a level of its own: refuse it above Enforce, and
// above Warn warn whoever made it and annotate its audit event.
type PodSecurity struct{ Enforce, Warn string }

// uniform is the PodSecurity of --pod-security-default level: that level
// enforced, warned and audited.
func uniform(level string) PodSecurity { return PodSecurity{Enforce: level, Warn: level} }

// clusterDefaults are the PodSecurity of a cluster whose server is given
// no --pod-security-default, by the name its record holds. "baseline" is
// kelp's: it refuses what gives a pod the node (privileged containers,
// the host's namespaces, hostPath, hostPort, capabilities beyond the
// default set) yet runs most applications' charts unchanged, and its
// restricted warnings show what the next step would refuse. "privileged"
// is upstream's, which kelp had before, kept by the clusters made then:
// an upgrade must not start refusing their pods.
var clusterDefaults = map[string]PodSecurity{
	"baseline":   {Enforce: "baseline", Warn: "restricted"},
	"privileged": uniform("privileged"),
}

// ResolvePodSecurity returns the PodSecurity the apiserver runs with:
// uniform(given) when --pod-security-default is given, else the cluster's
// default, named in the file record. At a cluster's first start, flag or
// not, record is written once: "privileged" when earlier says the data
// dir holds a cluster made before record existed, "baseline" otherwise;
// a later kelp that changes its default thus changes no cluster's. An
// empty or truncated record, which names no default, counts as absent.
func ResolvePodSecurity(record, given string, earlier bool) (PodSecurity, error) {
	kept, err := os.ReadFile(record)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return PodSecurity{}, fmt.Errorf("read the cluster's Pod Security default: %w", err)
	}
	name := strings.TrimSpace(string(kept))
	if _, ok := clusterDefaults[name]; !ok {
		name = "baseline"
		if earlier {
			name = "privileged"
		}
		if err := atomicfile.Write(record, []byte(name+"\n"), 0o600); err != nil {
			return PodSecurity{}, fmt.Errorf("record the cluster's Pod Security default: %w", err)
		}
	}
	if given != "" {
		return uniform(given), nil
	}
	return clusterDefaults[name], nil
}

// WriteAdmissionConfig writes the admission plugins' configuration to
// path: Pod Security admission applies ps to every namespace without a
// level of its own, except kube-system, where system add-ons run.
func WriteAdmissionConfig(path string, ps PodSecurity) error {
	return writeConfig(path, fmt.Sprintf(`# Written by kelp at every start from --pod-security-default or the cluster's default.
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: %q
      enforce-version: latest
      audit: %q
      audit-version: latest
      warn: %q
      warn-version: latest
    exemptions:
      namespaces: [kube-system]
`, ps.Enforce, ps.Warn, ps.Warn))
}

// WriteAuthenticationConfig writes to path an authentication
// configuration that lets anonymous requests reach only paths: those of
// kelp's join API, which nodes call before they have credentials, and
// the health and version endpoints. Any other anonymous request is
// refused as unauthenticated, whatever RBAC grants system:unauthenticated
// (the CIS benchmark's anonymous-auth check, without breaking joins).
func WriteAuthenticationConfig(path string, paths []string) error {
	var b strings.Builder
	b.WriteString(`# Written by kelp at every start.
apiVersion: apiserver.config.k8s.io/v1
kind: AuthenticationConfiguration
anonymous:
  enabled: true
  conditions:
`)
	for _, p := range paths {
		fmt.Fprintf(&b, "  - path: %q\n", p)
	}
	return writeConfig(path, b.String())
}

// writeConfig writes content to path unless it is there already: these
// files are written at every start, and an unchanged one costs no flash.
func writeConfig(path, content string) error {
	if have, err := os.ReadFile(path); err == nil && string(have) == content {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	if err := atomicfile.Write(path, []byte(content), 0o600); err != nil {
		return fmt.Errorf("write apiserver configuration: %w", err)
	}
	return nil
}
