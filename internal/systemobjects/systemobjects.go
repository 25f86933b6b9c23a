package systemobjects

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/apply"
	"github.com/kelp-dev/kelp/internal/fleet"
	"github.com/kelp-dev/kelp/internal/gateway"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/pki"
)

// controllerRole is the name of the nodes' controllers' ClusterRole and
// its binding, that of the identity they shared before each had its own:
// applying the binding anew takes the grant from that identity.
const controllerRole = "system:kelp-controller"

// joinAPIRole is the name clusters made by earlier versions already know
// the join API's role by; a new name would leave the old role behind.
const joinAPIRole = "kelp:supervisor"

// dnsService is the Service clients that look for cluster DNS by name
// find. The coredns manifest makes it; its address is checked here.
const dnsService = "kube-dns"

// Config says which of kelp's objects the cluster needs.
type Config struct {
	// DNS is whether nodes serve cluster DNS; then an existing kube-dns
	// Service must have the cluster DNS address (CheckDNSService).
	DNS bool
	// ClusterDNS is the cluster DNS address; required with DNS.
	ClusterDNS netip.Addr
	// ServerCA is the server CA bundle (PEM), which the apiservers verify
	// the volumes webhook with; required.
	ServerCA []byte
}

// Apply makes kelp's objects what this version defines: missing ones are
// created, and kelp's fields on existing ones are overwritten. These are
// what the server needs before any node joins; the objects of optional
// parts (cluster DNS, storage, metrics) are built-in manifests instead.
func Apply(ctx context.Context, c kubernetes.Interface, cfg Config) error {
	if cfg.DNS {
		if err := CheckDNSService(ctx, c, cfg.ClusterDNS); err != nil {
			return err
		}
	}
	// The policies and the webhook go first: the grant to each node's
	// identity must not be in force before the rules that keep it to its
	// own node.
	if err := applyNodeAdmission(ctx, c, cfg.ServerCA); err != nil {
		return err
	}
	for _, r := range []boundClusterRole{joinAPIAccess(), controllerAccess()} {
		if err := r.apply(ctx, c); err != nil {
			return err
		}
	}
	return gatewayConfigAccess().apply(ctx, c)
}

// CheckDNSService fails when the kube-dns Service exists with an address
// other than clusterDNS. A Service's address cannot change: applying the
// coredns manifest would only say "field is immutable", which does not
// tell the user what to do, and every node would answer on an address no
// client asks.
func CheckDNSService(ctx context.Context, c kubernetes.Interface, clusterDNS netip.Addr) error {
	if !clusterDNS.IsValid() {
		return errors.New("check the kube-dns Service: cluster DNS needs the cluster DNS address")
	}
	old, err := c.CoreV1().Services(metav1.NamespaceSystem).Get(ctx, dnsService, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("get the %s Service: %w", dnsService, err)
	case old.Spec.ClusterIP != clusterDNS.String():
		return fmt.Errorf("the %s Service in %s has the address %s, not the cluster DNS address %s: start kelp with --cluster-dns %s, or delete the Service (kubectl -n %[2]s delete service %[1]s) for kelp to make it anew",
			dnsService, metav1.NamespaceSystem, old.Spec.ClusterIP, clusterDNS, old.Spec.ClusterIP)
	}
	return nil
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
				WithNonResourceURLs(joinapi.CACertsPath, joinapi.PingPath, joinapi.JoinPath, joinapi.ServerJoinPath, joinapi.WitnessJoinPath).
				WithVerbs("get", "post"),
		},
		subjects: []*rbacv1ac.SubjectApplyConfiguration{group("system:unauthenticated"), group("system:authenticated")},
	}
}

// controllerAccess lets the nodes' controllers (overlay, NetworkPolicy,
// the gateway data path) read what decides who may talk to whom, where
// Services' endpoints are and the Upgrades their Nodes ask for, and
// publish their overlay addresses and upgrade reports on their Nodes (a
// node's kubelet identity may not list the
// others). It grants every node's identity, the group pki issues them in;
// the nodes policy (nodeadmission.go) keeps each to its own Node.
func controllerAccess() boundClusterRole {
	return boundClusterRole{
		name: controllerRole,
		rules: []*rbacv1ac.PolicyRuleApplyConfiguration{
			rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("pods", "namespaces").WithVerbs("list", "watch"),
			rbacv1ac.PolicyRule().WithAPIGroups("networking.k8s.io").WithResources("networkpolicies").WithVerbs("list", "watch"),
			rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("nodes").WithVerbs("get", "list", "watch", "patch"),
			rbacv1ac.PolicyRule().WithAPIGroups("discovery.k8s.io").WithResources("endpointslices").WithVerbs("list", "watch"),
			rbacv1ac.PolicyRule().WithAPIGroups(fleet.Group).WithResources(fleet.Resource.Resource).WithVerbs("get", "list", "watch"),
		},
		subjects: []*rbacv1ac.SubjectApplyConfiguration{group(pki.ControllerGroup)},
	}
}

func (r boundClusterRole) apply(ctx context.Context, c kubernetes.Interface) error {
	role := rbacv1ac.ClusterRole(r.name).WithRules(r.rules...)
	if _, err := c.RbacV1().ClusterRoles().Apply(ctx, role, apply.Options()); err != nil {
		return fmt.Errorf("apply ClusterRole %s: %w", r.name, err)
	}
	binding := rbacv1ac.ClusterRoleBinding(r.name).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(r.name)).
		WithSubjects(r.subjects...)
	if _, err := c.RbacV1().ClusterRoleBindings().Apply(ctx, binding, apply.Options()); err != nil {
		return fmt.Errorf("apply ClusterRoleBinding %s: %w", r.name, err)
	}
	return nil
}

func group(name string) *rbacv1ac.SubjectApplyConfiguration {
	return rbacv1ac.Subject().WithAPIGroup(rbacv1.GroupName).WithKind(rbacv1.GroupKind).WithName(name)
}

// boundRole is a Role and the RoleBinding of the same name that grants it,
// in one namespace.
type boundRole struct {
	namespace, name string
	rules           []*rbacv1ac.PolicyRuleApplyConfiguration
	subjects        []*rbacv1ac.SubjectApplyConfiguration
}

// gatewayConfigAccess lets every node's data path read the gateway's
// configuration, and no other Secret: it holds the listeners' TLS keys,
// which every node serves. A list or watch passes only with a field
// selector on that one name.
func gatewayConfigAccess() boundRole {
	return boundRole{
		namespace: metav1.NamespaceSystem,
		name:      controllerRole + ":gateway",
		rules: []*rbacv1ac.PolicyRuleApplyConfiguration{
			rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("secrets").WithResourceNames(gateway.ConfigSecret).WithVerbs("get", "list", "watch"),
		},
		subjects: []*rbacv1ac.SubjectApplyConfiguration{group(pki.ControllerGroup)},
	}
}

func (r boundRole) apply(ctx context.Context, c kubernetes.Interface) error {
	role := rbacv1ac.Role(r.name, r.namespace).WithRules(r.rules...)
	if _, err := c.RbacV1().Roles(r.namespace).Apply(ctx, role, apply.Options()); err != nil {
		return fmt.Errorf("apply Role %s/%s: %w", r.namespace, r.name, err)
	}
	binding := rbacv1ac.RoleBinding(r.name, r.namespace).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("Role").WithName(r.name)).
		WithSubjects(r.subjects...)
	if _, err := c.RbacV1().RoleBindings(r.namespace).Apply(ctx, binding, apply.Options()); err != nil {
		return fmt.Errorf("apply RoleBinding %s/%s: %w", r.namespace, r.name, err)
	}
	return nil
}
