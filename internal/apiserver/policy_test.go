package apiserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	podsecurityv1 "k8s.io/pod-security-admission/admission/api/v1"
)

// The files kelp writes are what the apiserver's own types decode.
func TestConfigFilesDecode(t *testing.T) {
	dir := t.TempDir()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{auditv1.AddToScheme, apiserverv1.AddToScheme, podsecurityv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	decode := func(path string, into runtime.Object) {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := runtime.DecodeInto(serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDecoder(), data, into); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}

	policy := filepath.Join(dir, "etc", "audit-policy.yaml")
	if err := WriteDefaultAuditPolicy(policy); err != nil {
		t.Fatal(err)
	}
	var p auditv1.Policy
	decode(policy, &p)
	if last := p.Rules[len(p.Rules)-1]; last.Level != auditv1.LevelMetadata {
		t.Errorf("the last rule logs at %s, want Metadata: never request bodies", last.Level)
	}

	admission := filepath.Join(dir, "etc", "admission.yaml")
	if err := WriteAdmissionConfig(admission, PodSecurity{Enforce: "baseline", Warn: "restricted"}); err != nil {
		t.Fatal(err)
	}
	var a apiserverv1.AdmissionConfiguration
	decode(admission, &a)
	if len(a.Plugins) != 1 || a.Plugins[0].Name != "PodSecurity" || a.Plugins[0].Configuration == nil {
		t.Fatalf("admission configuration %+v", a)
	}
	var ps podsecurityv1.PodSecurityConfiguration
	if err := runtime.DecodeInto(serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDecoder(), a.Plugins[0].Configuration.Raw, &ps); err != nil {
		t.Fatal(err)
	}
	if d := ps.Defaults; d.Enforce != "baseline" || d.Warn != "restricted" || d.Audit != "restricted" || len(ps.Exemptions.Namespaces) != 1 || ps.Exemptions.Namespaces[0] != "kube-system" {
		t.Errorf("Pod Security configuration %+v, want baseline enforced, restricted warned and audited, kube-system exempt", ps)
	}
}

// A cluster keeps the Pod Security default it was made with across
// starts and upgrades; only the flag changes it.
func TestResolvePodSecurity(t *testing.T) {
	kelps := PodSecurity{Enforce: "baseline", Warn: "restricted"}
	upstreams := PodSecurity{Enforce: "privileged", Warn: "privileged"}
	for _, tc := range []struct {
		name, record, given string
		noRecord, earlier   bool
		want                PodSecurity
		wantRecord          string
	}{
		{name: "a new cluster", noRecord: true, want: kelps, wantRecord: "baseline"},
		{name: "a cluster made by an earlier kelp", noRecord: true, earlier: true, want: upstreams, wantRecord: "privileged"},
		{name: "the next start of a new cluster", record: "baseline\n", earlier: true, want: kelps, wantRecord: "baseline"},
		{name: "the next start of an earlier cluster", record: "privileged\n", earlier: true, want: upstreams, wantRecord: "privileged"},
		{name: "the flag on a new cluster", noRecord: true, given: "restricted", want: PodSecurity{"restricted", "restricted"}, wantRecord: "baseline"},
		{name: "the flag on an earlier cluster", record: "privileged\n", earlier: true, given: "baseline", want: PodSecurity{"baseline", "baseline"}, wantRecord: "privileged"},
		{name: "the flag keeping privileged", record: "baseline\n", given: "privileged", want: upstreams, wantRecord: "baseline"},
		{name: "an empty record, earlier cluster", record: "", earlier: true, want: upstreams, wantRecord: "privileged"},
		{name: "an empty record, new cluster", record: "", want: kelps, wantRecord: "baseline"},
		{name: "a truncated record", record: "basel", earlier: true, want: upstreams, wantRecord: "privileged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			record := filepath.Join(t.TempDir(), "pod-security-default")
			if !tc.noRecord {
				if err := os.WriteFile(record, []byte(tc.record), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ResolvePodSecurity(record, tc.given, tc.earlier)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			kept, err := os.ReadFile(record)
			if err != nil || strings.TrimSpace(string(kept)) != tc.wantRecord {
				t.Errorf("record %q (%v), want %q", kept, err, tc.wantRecord)
			}
		})
	}
}
