package server

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/nodeaddress"
	"github.com/kelp-dev/kelp/internal/servicelb"
)

// dnsUser is the identity of the nodes' DNS servers (pki's DNS cert).
const dnsUser = "system:kelp-dns"

// ensureDNSObjects creates what cluster DNS needs from the API: read access
// for the nodes' DNS servers, and the kube-dns Service with the cluster DNS
// address for clients that look for it. Existing objects are left alone.
func ensureDNSObjects(ctx context.Context, adminKubeconfig string, clusterDNS netip.Addr) error {
	c, err := adminClient(adminKubeconfig)
	if err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: dnsUser},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}
	service := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
		Spec: corev1.ServiceSpec{
			ClusterIP: clusterDNS.String(),
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
			},
		},
	}
	// The DNS servers read their customisation from one ConfigMap.
	customRole := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: dnsUser, Namespace: "kube-system"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}
	customBinding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: dnsUser, Namespace: "kube-system"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: dnsUser},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: dnsUser}},
	}
	if err := createAll(ctx, "cluster DNS objects",
		func() error {
			_, err := c.RbacV1().Roles("kube-system").Create(ctx, customRole, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := c.RbacV1().RoleBindings("kube-system").Create(ctx, customBinding, metav1.CreateOptions{})
			return err
		},
		func() error { return createClusterRole(ctx, c, role) },
	); err != nil {
		return err
	}
	// Looked up first: creating a Service whose ClusterIP is taken fails
	// as invalid, not as already there.
	services := c.CoreV1().Services("kube-system")
	_, err = services.Get(ctx, service.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = services.Create(ctx, service, metav1.CreateOptions{})
	}
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the kube-dns Service: %w", err)
	}
	return nil
}

// startNodeAddresses runs the node address controller with the admin
// credentials.
func startNodeAddresses(ctx context.Context, adminKubeconfig string) (*component.Running, error) {
	c, err := adminClient(adminKubeconfig)
	if err != nil {
		return nil, err
	}
	return component.Go(ctx, "node addresses", func(ctx context.Context) error { return nodeaddress.Run(ctx, c) }), nil
}

// startServiceLB runs the built-in load balancer controller with the
// admin credentials.
func startServiceLB(ctx context.Context, adminKubeconfig string) (*component.Running, error) {
	c, err := adminClient(adminKubeconfig)
	if err != nil {
		return nil, err
	}
	return component.Go(ctx, "servicelb", func(ctx context.Context) error { return servicelb.Run(ctx, c) }), nil
}

// controllerUser is the identity of the nodes' own controllers, the
// overlay and NetworkPolicy (pki's controller cert).
const controllerUser = "system:kelp-controller"

// ensureControllerAccess lets the nodes' controllers read what decides who
// may talk to whom, and publish their overlay addresses on their Nodes
// (a node's own identity may no longer list the others).
func ensureControllerAccess(ctx context.Context, adminKubeconfig string) error {
	c, err := adminClient(adminKubeconfig)
	if err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: controllerUser},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
		},
	}
	return createAll(ctx, "node controller access", func() error { return createClusterRole(ctx, c, role) })
}

// createClusterRole creates role and binds it to subjects, or if there
// are none to the user of its name.
func createClusterRole(ctx context.Context, c kubernetes.Interface, role *rbacv1.ClusterRole, subjects ...rbacv1.Subject) error {
	if len(subjects) == 0 {
		subjects = []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: role.Name}}
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   subjects,
	}
	return createAll(ctx, "cluster role "+role.Name,
		func() error {
			_, err := c.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := c.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
			return err
		})
}

// createAll runs creates in order; objects that exist already are left
// alone.
func createAll(ctx context.Context, what string, creates ...func() error) error {
	for _, create := range creates {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s: %w", what, err)
		}
	}
	return ctx.Err()
}

func adminClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", kubeconfig, err)
	}
	return kubernetes.NewForConfig(rc)
}
