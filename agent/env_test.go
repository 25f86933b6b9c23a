package agent

import (
	"slices"
	"testing"
)

// TestChildEnviron: containerd, and through it the shims, runc and CNI
// plugins, get none of kelp's settings, which carry its secrets.
func TestChildEnviron(t *testing.T) {
	got := childEnviron([]string{
		"HOME=/root", "PATH=/usr/bin", "KELP_TOKEN=K10abc::server:s3cret", "KELP_AGENT_TOKEN=x",
		"KELP_DATASTORE_ENDPOINT=postgres://kelp:pw@db/kelp", "KELP_SNAPSHOT_S3_SECRET_KEY=y", "LANG=C.UTF-8",
	}, "/var/lib/kelp/agent/bin:/usr/bin")
	want := []string{"PATH=/var/lib/kelp/agent/bin:/usr/bin", "HOME=/root", "LANG=C.UTF-8"}
	if !slices.Equal(got, want) {
		t.Errorf("childEnviron = %q, want %q", got, want)
	}
}
