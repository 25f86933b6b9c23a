package systemobjects

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/joinapi"
)

// FieldManager owns every field kelp sets on its objects.
const FieldManager = "kelp"

// The identities of the nodes' clients: the common names of the
// certificates pki issues them.
const (
	dnsUser        = "system:kelp-dns"
	controllerUser = "system:kelp-controller"
)

// joinAPIRole is the name clusters made by earlier versions already know
// the join API's role by; a new name would leave the old role behind.
const joinAPIRole = "kelp:supervisor"

// dnsService is the Service clients that look for cluster DNS by name find.
const dnsService = "kube-dns"

// Config says which of kelp's objects the cluster needs.
type Config struct {
	// DNS is whether nodes serve cluster DNS. Without it the DNS objects
	// are left as they are, for a DNS of the user's own.
	DNS bool
	// ClusterDNS is the kube-dns Service's address; required with DNS.
	ClusterDNS netip.Addr
}

// Apply makes kelp's objects what this version defines: missing ones are
// created, and kelp's fields on existing ones are overwritten.
func Apply(ctx context.Context, c kubernetes.Interface, cfg Config) error {
	if cfg.DNS && !cfg.ClusterDNS.IsValid() {
		return errors.New("apply kelp's objects: cluster DNS needs the cluster DNS address")
	}
	roles := []boundClusterRole{joinAPIAccess(), controllerAccess()}
	if cfg.DNS {
		roles = append(roles, dnsAccess())
	}
	for _, r := range roles {
		if err := r.apply(ctx, c); err != nil {
			return err
		}
	}
	if !cfg.DNS {
		return nil
	}
	if err := applyDNSConfigAccess(ctx, c); err != nil {
		return err
	}
	return applyDNSService(ctx, c, cfg.ClusterDNS)
}

// applyOptions take the fields kelp sets from whoever changed them: kelp
// owns these objects. Without force, apply would conflict even with an
// older kelp, whose creates the apiserver records as an Update by another
// manager, not as kelp's apply.
func applyOptions() metav1.ApplyOptions {
	return metav1.ApplyOptions{FieldManager: FieldManager, Force: true}
}

// boundClusterRole is a ClusterRole and the ClusterRoleBinding of the same
// name that grants it.
type boundClusterRole struct {
	name     string
	rules    []*rbacv1ac.PolicyRuleApplyConfiguration
	subjects []*rbacv1ac.SubjectApplyConfiguration
}

// joinAPIAccess lets anyone reach the join API's paths: a node that joins
// has no credentials yet; the join checks its token.
func joinAPIAccess() boundClusterRole {
	return boundClusterRole{
		name: joinAPIRole,
		rules: []*rbacv1ac.PolicyRuleApplyConfiguration{
			rbacv1ac.PolicyRule().
				WithNonResourceURLs(joinapi.CACertsPath, joinapi.PingPath, joinapi.JoinPath, joinapi.ServerJoinPath).
				WithVerbs("get", "post"),
		},
		subjects: []*rbacv1ac.SubjectApplyConfiguration{group("system:unauthenticated"), group("system:authenticated")},
	}
}

// controllerAccess lets the nodes' controllers (overlay, NetworkPolicy)
// read what decides who may talk to whom, and publish their overlay
// addresses on their Nodes (a node's own identity may not list the
// others).
func controllerAccess() boundClusterRole {
	return boundClusterRole{
		name: controllerUser,
		rules: []*rbacv1ac.PolicyRuleApplyConfiguration{
			rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("pods", "namespaces").WithVerbs("list", "watch"),
			rbacv1ac.PolicyRule().WithAPIGroups("networking.k8s.io").WithResources("networkpolicies").WithVerbs("list", "watch"),
			rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("nodes").WithVerbs("get", "list", "watch", "patch"),
		},
		subjects: []*rbacv1ac.SubjectApplyConfiguration{user(controllerUser)},
	}
}

// dnsAccess lets the nodes' DNS servers read the names they answer.
func dnsAccess() boundClusterRole {
	return boundClusterRole{
		name: dnsUser,
		rules: []*rbacv1ac.PolicyRuleApplyConfiguration{
			rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("services", "pods", "namespaces").WithVerbs("list", "watch"),
			rbacv1ac.PolicyRule().WithAPIGroups("discovery.k8s.io").WithResources("endpointslices").WithVerbs("list", "watch"),
		},
		subjects: []*rbacv1ac.SubjectApplyConfiguration{user(dnsUser)},
	}
}

func (r boundClusterRole) apply(ctx context.Context, c kubernetes.Interface) error {
	role := rbacv1ac.ClusterRole(r.name).WithRules(r.rules...)
	if _, err := c.RbacV1().ClusterRoles().Apply(ctx, role, applyOptions()); err != nil {
		return fmt.Errorf("apply ClusterRole %s: %w", r.name, err)
	}
	binding := rbacv1ac.ClusterRoleBinding(r.name).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(r.name)).
		WithSubjects(r.subjects...)
	if _, err := c.RbacV1().ClusterRoleBindings().Apply(ctx, binding, applyOptions()); err != nil {
		return fmt.Errorf("apply ClusterRoleBinding %s: %w", r.name, err)
	}
	return nil
}

// applyDNSConfigAccess lets the nodes' DNS servers read their
// customisation, a ConfigMap in kube-system (dns.CustomConfigMap).
func applyDNSConfigAccess(ctx context.Context, c kubernetes.Interface) error {
	ns := metav1.NamespaceSystem
	role := rbacv1ac.Role(dnsUser, ns).WithRules(
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("configmaps").WithVerbs("get", "list", "watch"))
	if _, err := c.RbacV1().Roles(ns).Apply(ctx, role, applyOptions()); err != nil {
		return fmt.Errorf("apply Role %s/%s: %w", ns, dnsUser, err)
	}
	binding := rbacv1ac.RoleBinding(dnsUser, ns).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(dnsUser)).
		WithSubjects(user(dnsUser))
	if _, err := c.RbacV1().RoleBindings(ns).Apply(ctx, binding, applyOptions()); err != nil {
		return fmt.Errorf("apply RoleBinding %s/%s: %w", ns, dnsUser, err)
	}
	return nil
}

// applyDNSService gives the cluster DNS address to clients that look for
// the kube-dns Service. It has no selector: every node answers on the
// address itself.
func applyDNSService(ctx context.Context, c kubernetes.Interface, clusterDNS netip.Addr) error {
	services := c.CoreV1().Services(metav1.NamespaceSystem)
	// A Service's address cannot change; apply would only say "field is
	// immutable", which does not tell the user what to do.
	old, err := services.Get(ctx, dnsService, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("get the %s Service: %w", dnsService, err)
	case old.Spec.ClusterIP != clusterDNS.String():
		return fmt.Errorf("the %s Service in %s has the address %s, not the cluster DNS address %s: start kelp with --cluster-dns %s, or delete the Service (kubectl -n %[2]s delete service %[1]s) for kelp to make it anew",
			dnsService, metav1.NamespaceSystem, old.Spec.ClusterIP, clusterDNS, old.Spec.ClusterIP)
	}
	dnsPort := func(name string, protocol corev1.Protocol) *corev1ac.ServicePortApplyConfiguration {
		return corev1ac.ServicePort().WithName(name).WithProtocol(protocol).WithPort(53).WithTargetPort(intstr.FromInt32(53))
	}
	service := corev1ac.Service(dnsService, metav1.NamespaceSystem).
		WithLabels(map[string]string{"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}).
		WithSpec(corev1ac.ServiceSpec().
			WithClusterIP(clusterDNS.String()).
			WithPorts(dnsPort("dns", corev1.ProtocolUDP), dnsPort("dns-tcp", corev1.ProtocolTCP)))
	if _, err := services.Apply(ctx, service, applyOptions()); err != nil {
		return fmt.Errorf("apply the %s Service at %s: %w", dnsService, clusterDNS, err)
	}
	return nil
}

func user(name string) *rbacv1ac.SubjectApplyConfiguration {
	return rbacv1ac.Subject().WithAPIGroup(rbacv1.GroupName).WithKind(rbacv1.UserKind).WithName(name)
}

func group(name string) *rbacv1ac.SubjectApplyConfiguration {
	return rbacv1ac.Subject().WithAPIGroup(rbacv1.GroupName).WithKind(rbacv1.GroupKind).WithName(name)
}
