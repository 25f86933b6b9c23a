package systemobjects

import (
	"testing"

	"github.com/google/cel-go/cel"
	admissionv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
)

// The apiserver refuses a policy whose expressions do not parse; the
// cluster test (server/identity_test.go) checks what they decide.
func TestNodeAdmissionExpressionsParse(t *testing.T) {
	env, err := cel.NewEnv()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		name  string
		exprs []string
	}{{NodesPolicy, expressions(nodesPolicy().Spec)}, {VolumesPolicy, expressions(volumesPolicy().Spec)}} {
		if len(p.exprs) == 0 {
			t.Errorf("policy %s has no expressions", p.name)
		}
		for _, e := range p.exprs {
			if _, iss := env.Parse(e); iss.Err() != nil {
				t.Errorf("policy %s: %s\n%s", p.name, iss.Err(), e)
			}
		}
	}
}

func expressions(spec *admissionv1ac.ValidatingAdmissionPolicySpecApplyConfiguration) []string {
	var out []string
	for _, c := range spec.MatchConditions {
		out = append(out, *c.Expression)
	}
	for _, v := range spec.Variables {
		out = append(out, *v.Expression)
	}
	for _, v := range spec.Validations {
		out = append(out, *v.Expression, *v.MessageExpression)
	}
	return out
}
