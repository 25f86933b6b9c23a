package apiserver

import (
	"os"
	"path/filepath"
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
	if err := WriteAdmissionConfig(admission, "restricted"); err != nil {
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
	if ps.Defaults.Enforce != "restricted" || ps.Defaults.Warn != "restricted" || len(ps.Exemptions.Namespaces) != 1 {
		t.Errorf("Pod Security configuration %+v", ps)
	}
}
