package systemobjects

import (
	"context"
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	admissionv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/apply"
	"github.com/kelp-dev/kelp/internal/fleet"
	"github.com/kelp-dev/kelp/internal/gateway"
	"github.com/kelp-dev/kelp/internal/localstorage"
	"github.com/kelp-dev/kelp/internal/overlay"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/volumeadmission"
)

// Names of the ValidatingAdmissionPolicies (and of their bindings) that
// keep each node's controllers to their own node's objects.
const (
	NodesPolicy   = "kelp-node-controllers-nodes"
	VolumesPolicy = "kelp-node-controllers-volumes"
)

// ownNodeAnnotationPrefixes are the Node annotations a node's controllers
// write on their own Node: the overlay's (internal/overlay), the gateway
// data path's (internal/gateway), and the reports of its upgrades
// (internal/fleet; the request to upgrade is the server's, and not among
// them). The node's
// other kelp keys are written by others: the external IPs by the node's
// kubelet identity (agent/address.go, which NodeRestriction keeps to its
// own Node), addresses and load balancer status by the server's
// controllers (nodeaddress, servicelb) with the server's identity.
var ownNodeAnnotationPrefixes = []string{overlay.AnnotationPrefix, gateway.AnnotationPrefix, fleet.ReportPrefix}

// hostnameLabel is the node label local-path volumes' node affinity names
// their node by (internal/localstorage).
const hostnameLabel = "kubernetes.io/hostname"

// nodeControllerCondition matches the requests of nodes' controllers: those
// of each node's identity, and those of the identity all nodes shared
// before it, which holds no grant any more and, whatever a user grants
// it, writes no Node or volume.
var nodeControllerCondition = fmt.Sprintf(
	"request.userInfo.username == %s || request.userInfo.username.startsWith(%s) || (has(request.userInfo.groups) && %s in request.userInfo.groups)",
	quote(pki.SharedControllerUser), quote(pki.ControllerUserPrefix), quote(pki.ControllerGroup))

// ownedBy is a CEL expression true when the user is the controllers of the
// node that name (a CEL string expression) evaluates to.
func ownedBy(name string) string {
	return fmt.Sprintf("request.userInfo.username == %s + %s", quote(pki.ControllerUserPrefix), name)
}

// nodesPolicy lets a node's controllers change only their own Node, and on
// it only the annotations they publish: not its labels, taints,
// schedulability or other annotations (the address the apiserver reaches
// the kubelet at is one), which would let one node steer another's traffic
// or pods.
func nodesPolicy() *admissionv1ac.ValidatingAdmissionPolicyApplyConfiguration {
	var prefixes []string
	for _, p := range ownNodeAnnotationPrefixes {
		prefixes = append(prefixes, fmt.Sprintf("k.startsWith(%s)", quote(p)))
	}
	ownKey := "(" + strings.Join(prefixes, " || ") + ")"
	update := func(expr string) string { return "request.operation != 'UPDATE' || (" + expr + ")" }
	return policy(NodesPolicy, "nodes",
		[]*admissionv1ac.VariableApplyConfiguration{
			variable("oldAnnotations", "has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"),
			variable("newAnnotations", "has(object.metadata.annotations) ? object.metadata.annotations : {}"),
		},
		validation("request.operation == 'UPDATE' && "+ownedBy("oldObject.metadata.name"),
			"'a node\\'s controllers may change only their own Node: ' + request.userInfo.username + ' may not ' + request.operation.lowerAscii() + ' Node ' + request.name"),
		validation(update(same("spec")),
			"'a node\\'s controllers may not change a Node\\'s spec (schedulability, taints, pod CIDR): ' + request.userInfo.username"),
		validation(update("(has(object.metadata.labels) ? object.metadata.labels : {}) == (has(oldObject.metadata.labels) ? oldObject.metadata.labels : {})"),
			"'a node\\'s controllers may not change a Node\\'s labels: ' + request.userInfo.username"),
		validation(update(fmt.Sprintf("variables.newAnnotations.all(k, %[1]s || (k in variables.oldAnnotations && variables.oldAnnotations[k] == variables.newAnnotations[k])) && variables.oldAnnotations.all(k, %[1]s || k in variables.newAnnotations)", ownKey)),
			fmt.Sprintf("'a node\\'s controllers may change only the Node annotations %s: ' + request.userInfo.username", strings.Join(ownNodeAnnotationPrefixes, "*, ")+"*")),
		validation(update("(has(object.metadata.finalizers) ? object.metadata.finalizers : []) == (has(oldObject.metadata.finalizers) ? oldObject.metadata.finalizers : []) && (has(object.metadata.ownerReferences) ? object.metadata.ownerReferences : []) == (has(oldObject.metadata.ownerReferences) ? oldObject.metadata.ownerReferences : [])"),
			"'a node\\'s controllers may not change a Node\\'s finalizers or owners: ' + request.userInfo.username"),
	)
}

// volumesPolicy lets a node's controllers create, update and delete only
// their own node's local-path volumes: labelled with the node's name, which
// is how each node's provisioner finds its volumes, and usable only there.
// A node could otherwise make a volume another node provisions, deletes or
// removes the directory of.
func volumesPolicy() *admissionv1ac.ValidatingAdmissionPolicyApplyConfiguration {
	own := func(obj string) string {
		node := fmt.Sprintf("%s.metadata.labels[%s]", obj, quote(localstorage.NodeLabel))
		return fmt.Sprintf("has(%[1]s.metadata.labels) && %[2]s in %[1]s.metadata.labels && %[3]s && "+
			"has(%[1]s.spec.nodeAffinity) && has(%[1]s.spec.nodeAffinity.required) && size(%[1]s.spec.nodeAffinity.required.nodeSelectorTerms) > 0 && "+
			"%[1]s.spec.nodeAffinity.required.nodeSelectorTerms.all(t, has(t.matchExpressions) && t.matchExpressions.exists(e, e.key == %[4]s && e.operator == 'In' && e.values == [%[5]s]))",
			obj, quote(localstorage.NodeLabel), ownedBy(node), quote(hostnameLabel), node)
	}
	return policy(VolumesPolicy, "persistentvolumes",
		[]*admissionv1ac.VariableApplyConfiguration{
			variable("newOwn", own("object")),
			variable("oldOwn", own("oldObject")),
		},
		validation("request.operation != 'CREATE' || (variables.newOwn && has(object.spec.local))",
			fmt.Sprintf("'a node\\'s controllers may create only local volumes of their own node, labelled %s=<node> with node affinity %s In [<node>]: ' + request.userInfo.username", localstorage.NodeLabel, hostnameLabel)),
		validation("request.operation != 'DELETE' || variables.oldOwn",
			"'a node\\'s controllers may delete only their own node\\'s volumes: ' + request.userInfo.username + ' may not delete ' + request.name"),
		validation("request.operation != 'UPDATE' || (variables.oldOwn && variables.newOwn && "+same("spec")+" && object.metadata.labels == oldObject.metadata.labels && (has(object.metadata.finalizers) ? object.metadata.finalizers : []).all(f, has(oldObject.metadata.finalizers) && f in oldObject.metadata.finalizers))",
			"'a node\\'s controllers may only take their finalizer off their own node\\'s volumes: ' + request.userInfo.username + ' may not update ' + request.name"),
	)
}

// policy is a policy on resource, of the core group, for the requests of
// nodes' controllers.
func policy(name, resource string, variables []*admissionv1ac.VariableApplyConfiguration, validations ...*admissionv1ac.ValidationApplyConfiguration) *admissionv1ac.ValidatingAdmissionPolicyApplyConfiguration {
	return admissionv1ac.ValidatingAdmissionPolicy(name).WithSpec(admissionv1ac.ValidatingAdmissionPolicySpec().
		WithFailurePolicy(admissionregistrationv1.Fail).
		WithMatchConstraints(admissionv1ac.MatchResources().WithResourceRules(admissionv1ac.NamedRuleWithOperations().
			WithAPIGroups("").WithAPIVersions("*").WithResources(resource).
			WithOperations(admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete))).
		WithMatchConditions(admissionv1ac.MatchCondition().WithName("node-controllers").WithExpression(nodeControllerCondition)).
		WithVariables(variables...).
		WithValidations(validations...))
}

func variable(name, expr string) *admissionv1ac.VariableApplyConfiguration {
	return admissionv1ac.Variable().WithName(name).WithExpression(expr)
}

// validation denies, as Forbidden, what expr is false for, saying why by
// message, a CEL expression.
func validation(expr, message string) *admissionv1ac.ValidationApplyConfiguration {
	return admissionv1ac.Validation().WithExpression(expr).WithMessageExpression(message).WithReason(metav1.StatusReasonForbidden)
}

// same is a CEL expression true when field of the object is as it was:
// both lack it, or both have it alike.
func same(field string) string {
	return fmt.Sprintf("has(object.%[1]s) == has(oldObject.%[1]s) && (!has(object.%[1]s) || object.%[1]s == oldObject.%[1]s)", field)
}

// quote makes s a CEL string literal; s holds no quote or backslash.
func quote(s string) string { return "'" + s + "'" }

// applyNodeAdmission applies the policies and their bindings, which deny
// what they reject everywhere, and the volumes webhook, whose caBundle is
// the server CA.
func applyNodeAdmission(ctx context.Context, c kubernetes.Interface, caBundle []byte) error {
	for _, p := range []*admissionv1ac.ValidatingAdmissionPolicyApplyConfiguration{nodesPolicy(), volumesPolicy()} {
		if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Apply(ctx, p, apply.Options()); err != nil {
			return fmt.Errorf("apply ValidatingAdmissionPolicy %s: %w", *p.Name, err)
		}
		binding := admissionv1ac.ValidatingAdmissionPolicyBinding(*p.Name).WithSpec(admissionv1ac.ValidatingAdmissionPolicyBindingSpec().
			WithPolicyName(*p.Name).WithValidationActions(admissionregistrationv1.Deny))
		if _, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Apply(ctx, binding, apply.Options()); err != nil {
			return fmt.Errorf("apply ValidatingAdmissionPolicyBinding %s: %w", *p.Name, err)
		}
	}
	if len(caBundle) == 0 {
		return fmt.Errorf("apply ValidatingWebhookConfiguration %s: no server CA to verify the webhook with", VolumesWebhook)
	}
	if _, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Apply(ctx, volumesWebhook(caBundle), apply.Options()); err != nil {
		return fmt.Errorf("apply ValidatingWebhookConfiguration %s: %w", VolumesWebhook, err)
	}
	return nil
}

// VolumesWebhook names the ValidatingWebhookConfiguration that sends the
// volumes nodes' controllers create to the kelp beside each apiserver
// (internal/volumeadmission), which checks the claim a volume is pre-bound
// to: a policy cannot look it up.
const VolumesWebhook = "kelp-node-controllers-volumes"

// volumesWebhookName is the webhook's own name, which the apiserver's
// refusals quote.
const volumesWebhookName = "volumes.node-controllers.kelp.io"

// volumesWebhook calls https://127.0.0.1: every apiserver calls the kelp
// that runs it, so servers need no Service and no address of each other,
// and the server CA, in caBundle, verifies the apiserver's own serving
// certificate, which that kelp serves it with. It matches only the
// creates of nodes' controllers, so no other request waits for it.
func volumesWebhook(caBundle []byte) *admissionv1ac.ValidatingWebhookConfigurationApplyConfiguration {
	return admissionv1ac.ValidatingWebhookConfiguration(VolumesWebhook).WithWebhooks(admissionv1ac.ValidatingWebhook().
		WithName(volumesWebhookName).
		WithClientConfig(admissionv1ac.WebhookClientConfig().WithURL(volumeadmission.URL()).WithCABundle(caBundle...)).
		WithRules(admissionv1ac.RuleWithOperations().
			WithAPIGroups("").WithAPIVersions("v1").WithResources("persistentvolumes").WithScope(admissionregistrationv1.ClusterScope).
			WithOperations(admissionregistrationv1.Create)).
		WithMatchPolicy(admissionregistrationv1.Equivalent).
		WithMatchConditions(admissionv1ac.MatchCondition().WithName("node-controllers").WithExpression(nodeControllerCondition)).
		WithFailurePolicy(admissionregistrationv1.Fail).
		WithSideEffects(admissionregistrationv1.SideEffectClassNone).
		WithTimeoutSeconds(5).
		WithAdmissionReviewVersions("v1"))
}
