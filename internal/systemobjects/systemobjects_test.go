package systemobjects

import (
	"context"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kelp-dev/kelp/internal/apply"
	"github.com/kelp-dev/kelp/internal/pki"
)

// serverCA stands for the server CA bundle, which Apply copies into the
// volumes webhook's caBundle.
var serverCA = []byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")

var withDNS = Config{DNS: true, ClusterDNS: netip.MustParseAddr("10.43.0.10"), ServerCA: serverCA}

// objects are every object of the kinds kelp applies, by "Kind namespace/name".
func objects(t *testing.T, c kubernetes.Interface) map[string]metav1.Object {
	t.Helper()
	ctx := context.Background()
	out := map[string]metav1.Object{}
	add := func(kind string, o metav1.Object) { out[kind+" "+o.GetNamespace()+"/"+o.GetName()] = o }
	crs, err := c.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range crs.Items {
		add("ClusterRole", &crs.Items[i])
	}
	crbs, err := c.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range crbs.Items {
		add("ClusterRoleBinding", &crbs.Items[i])
	}
	roles, err := c.RbacV1().Roles("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range roles.Items {
		add("Role", &roles.Items[i])
	}
	rbs, err := c.RbacV1().RoleBindings("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range rbs.Items {
		add("RoleBinding", &rbs.Items[i])
	}
	policies, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range policies.Items {
		add("ValidatingAdmissionPolicy", &policies.Items[i])
	}
	bindings, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range bindings.Items {
		add("ValidatingAdmissionPolicyBinding", &bindings.Items[i])
	}
	webhooks, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range webhooks.Items {
		add("ValidatingWebhookConfiguration", &webhooks.Items[i])
	}
	services, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range services.Items {
		add("Service", &services.Items[i])
	}
	return out
}

func keys(m map[string]metav1.Object) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	sort.Strings(k)
	return k
}

var (
	nodesRule    = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}}
	upgradesRule = rbacv1.PolicyRule{APIGroups: []string{"kelp.io"}, Resources: []string{"upgrades"}, Verbs: []string{"get", "list", "watch"}}
)

// An older kelp created system:kelp-controller before the overlay needed
// Nodes; after an upgrade the role must carry the new rule, or the
// overlay cannot list or patch Nodes.
func TestApplyUpgradesAnOlderClusterRole(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	old := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: controllerRole},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch"}},
		},
	}
	// The older kelp created it as "kelp", its user agent, with a create:
	// to the apiserver another manager than kelp's apply.
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, old, metav1.CreateOptions{FieldManager: "kelp"}); err != nil {
		t.Fatal(err)
	}

	if err := Apply(ctx, c, withDNS); err != nil {
		t.Fatalf("Apply: %v", err)
	}

	got, err := c.RbacV1().ClusterRoles().Get(ctx, controllerRole, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(got.Rules, func(r rbacv1.PolicyRule) bool { return reflect.DeepEqual(r, nodesRule) }) {
		t.Errorf("ClusterRole %s after Apply has rules %+v, without %+v", controllerRole, got.Rules, nodesRule)
	}
	if !slices.ContainsFunc(got.Rules, func(r rbacv1.PolicyRule) bool { return reflect.DeepEqual(r, upgradesRule) }) {
		t.Errorf("ClusterRole %s after Apply has rules %+v, without %+v: the nodes cannot read the Upgrades they are asked for", controllerRole, got.Rules, upgradesRule)
	}
	if len(got.Rules) != 5 {
		t.Errorf("ClusterRole %s after Apply has %d rules, want 5: %+v", controllerRole, len(got.Rules), got.Rules)
	}
}

func TestApplyIsIdempotent(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	if err := Apply(ctx, c, withDNS); err != nil {
		t.Fatalf("first Apply: %v", err)
	}
	first := objects(t, c)
	if err := Apply(ctx, c, withDNS); err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	second := objects(t, c)
	if !reflect.DeepEqual(keys(first), keys(second)) {
		t.Fatalf("objects after the first Apply %v, after the second %v", keys(first), keys(second))
	}
	for k, o := range first {
		if !reflect.DeepEqual(o, second[k]) {
			t.Errorf("%s changed on the second Apply:\nfirst  %+v\nsecond %+v", k, o, second[k])
		}
	}
}

func TestApplyOwnsEveryObjectAsKelp(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	if err := Apply(ctx, c, withDNS); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	got := objects(t, c)
	want := []string{
		"ClusterRole /kelp:supervisor",
		"ClusterRole /system:kelp-controller",
		"ClusterRoleBinding /kelp:supervisor",
		"ClusterRoleBinding /system:kelp-controller",
		"Role kube-system/system:kelp-controller:gateway",
		"RoleBinding kube-system/system:kelp-controller:gateway",
		"ValidatingAdmissionPolicy /" + NodesPolicy,
		"ValidatingAdmissionPolicy /" + VolumesPolicy,
		"ValidatingAdmissionPolicyBinding /" + NodesPolicy,
		"ValidatingAdmissionPolicyBinding /" + VolumesPolicy,
		"ValidatingWebhookConfiguration /" + VolumesWebhook,
	}
	if !reflect.DeepEqual(keys(got), want) {
		t.Fatalf("objects after Apply:\n%s\nwant:\n%s", strings.Join(keys(got), "\n"), strings.Join(want, "\n"))
	}
	for k, o := range got {
		if !slices.ContainsFunc(o.GetManagedFields(), func(e metav1.ManagedFieldsEntry) bool {
			return e.Manager == apply.FieldManager && e.Operation == metav1.ManagedFieldsOperationApply
		}) {
			t.Errorf("%s is not applied by %q: managed fields %+v", k, apply.FieldManager, o.GetManagedFields())
		}
	}

	join := got["ClusterRoleBinding /kelp:supervisor"].(*rbacv1.ClusterRoleBinding)
	if len(join.Subjects) != 2 || join.Subjects[0].Name != "system:unauthenticated" || join.Subjects[1].Name != "system:authenticated" {
		t.Errorf("kelp:supervisor is bound to %+v, want everyone", join.Subjects)
	}
	gatewayRole := got["Role kube-system/system:kelp-controller:gateway"].(*rbacv1.Role)
	wantRules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"kelp-gateway"}, Verbs: []string{"get", "list", "watch"}}}
	if !reflect.DeepEqual(gatewayRole.Rules, wantRules) {
		t.Errorf("the nodes' gateway Role grants %+v, want the one Secret: %+v", gatewayRole.Rules, wantRules)
	}
	controllers := got["ClusterRoleBinding /system:kelp-controller"].(*rbacv1.ClusterRoleBinding)
	wantSubjects := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:kelp-controllers"}}
	if !reflect.DeepEqual(controllers.Subjects, wantSubjects) {
		t.Errorf("system:kelp-controller is bound to %+v, want %+v", controllers.Subjects, wantSubjects)
	}
}

// Without cluster DNS a DNS of the user's own may hold kube-dns at any
// address.
func TestApplyWithoutDNSLeavesKubeDNSAlone(t *testing.T) {
	ctx := context.Background()
	own := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.43.0.53", Selector: map[string]string{"app": "my-dns"}},
	}
	c := fake.NewClientset(own)
	if err := Apply(ctx, c, Config{ServerCA: serverCA}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if svc := objects(t, c)["Service kube-system/kube-dns"]; !reflect.DeepEqual(svc, own) {
		t.Errorf("the user's kube-dns Service changed to %+v", svc)
	}
}

// The kube-dns Service itself comes from the coredns manifest; Apply only
// checks an existing one, and leaves a missing one to the manifest.
func TestApplyAcceptsKubeDNSAtTheClusterDNSAddress(t *testing.T) {
	for _, existing := range [][]runtime.Object{nil, {&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.43.0.10"},
	}}} {
		c := fake.NewClientset(existing...)
		if err := Apply(context.Background(), c, withDNS); err != nil {
			t.Errorf("Apply with kube-dns %v: %v", existing, err)
		}
		if got := len(objects(t, c)); got != 11+len(existing) {
			t.Errorf("Apply with kube-dns %v left %d objects, want kelp's 11 and the Service", existing, got)
		}
	}
}

func TestApplyRefusesToMoveKubeDNS(t *testing.T) {
	old := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system"},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.43.0.53"},
	}
	err := Apply(context.Background(), fake.NewClientset(old), withDNS)
	if err == nil || !strings.Contains(err.Error(), "10.43.0.53") || !strings.Contains(err.Error(), "delete service kube-dns") {
		t.Errorf("Apply with kube-dns at another address: error %v, want one naming the address and how to fix it", err)
	}
}

func TestApplyNeedsTheClusterDNSAddress(t *testing.T) {
	if err := Apply(context.Background(), fake.NewClientset(), Config{DNS: true, ServerCA: serverCA}); err == nil {
		t.Error("Apply with DNS and no address succeeded")
	}
}

// Clusters made before each node had its own identity bound the nodes'
// controllers' role to the one identity all shared: the same Apply that
// grants each node's identity takes the grant from the shared one.
func TestApplyTakesTheGrantFromTheSharedControllerIdentity(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	old := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: controllerRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: controllerRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: pki.SharedControllerUser}},
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, old, metav1.CreateOptions{FieldManager: "kelp"}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(ctx, c, withDNS); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	got, err := c.RbacV1().ClusterRoleBindings().Get(ctx, controllerRole, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:kelp-controllers"}}
	if !reflect.DeepEqual(got.Subjects, want) {
		t.Errorf("%s after Apply is bound to %+v, want %+v", controllerRole, got.Subjects, want)
	}
}
