package apiserver

import (
	"fmt"
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

// PodSecurityLevels are the levels Pod Security admission enforces.
var PodSecurityLevels = []string{"privileged", "baseline", "restricted"}

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

// WriteAdmissionConfig writes the admission plugins' configuration to
// path: Pod Security admission enforces, audits and warns at level for
// every namespace without a level of its own, except kube-system, where
// system add-ons run.
func WriteAdmissionConfig(path, level string) error {
	return writeConfig(path, fmt.Sprintf(`# Written by kelp at every start from --pod-security-default.
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: %[1]q
      enforce-version: latest
      audit: %[1]q
      audit-version: latest
      warn: %[1]q
      warn-version: latest
    exemptions:
      namespaces: [kube-system]
`, level))
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
