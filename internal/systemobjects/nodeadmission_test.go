package systemobjects

import (
	"bytes"
	"context"
	"reflect"
	"testing"

	"github.com/google/cel-go/cel"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	admissionv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	"k8s.io/client-go/kubernetes/fake"
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

// The volumes webhook is sent what the policies are, the creates of
// nodes' controllers alone, at the kelp beside each apiserver, and fails
// closed.
func TestVolumesWebhook(t *testing.T) {
	c := fake.NewClientset()
	if err := Apply(context.Background(), c, withDNS); err != nil {
		t.Fatal(err)
	}
	got, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), VolumesWebhook, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Webhooks) != 1 {
		t.Fatalf("%d webhooks, want 1", len(got.Webhooks))
	}
	w := got.Webhooks[0]
	if w.ClientConfig.URL == nil || *w.ClientConfig.URL != "https://127.0.0.1:6446/validate-persistentvolume" || !bytes.Equal(w.ClientConfig.CABundle, serverCA) {
		t.Errorf("client config %+v, want https://127.0.0.1:6446/validate-persistentvolume with the server CA", w.ClientConfig)
	}
	if len(w.Rules) != 1 || !reflect.DeepEqual(w.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) ||
		!reflect.DeepEqual(w.Rules[0].Resources, []string{"persistentvolumes"}) {
		t.Errorf("rules %+v, want the creates of persistentvolumes", w.Rules)
	}
	if len(w.MatchConditions) != 1 || w.MatchConditions[0].Expression != nodeControllerCondition {
		t.Errorf("match conditions %+v, want the policies' %s", w.MatchConditions, nodeControllerCondition)
	}
	if *w.FailurePolicy != admissionregistrationv1.Fail || *w.SideEffects != admissionregistrationv1.SideEffectClassNone || *w.TimeoutSeconds > 10 {
		t.Errorf("failure policy %s, side effects %s, timeout %d s: want Fail, None and a few seconds", *w.FailurePolicy, *w.SideEffects, *w.TimeoutSeconds)
	}
	if err := Apply(context.Background(), fake.NewClientset(), Config{}); err == nil {
		t.Error("Apply without the server CA succeeded")
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
