package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/systemobjects"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// controllerClient is a client with the credentials of node n's
// controllers (overlay, NetworkPolicy, local storage), as the node keeps
// them, dialing from the node's network namespace.
func controllerClient(t *testing.T, n *testcluster.Node) kubernetes.Interface {
	t.Helper()
	path := layout.Agent(n.DataDir).ControllerKubeconfig
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	cfg.Dial = n.DialContext
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A node's controllers act as that node (the audit log names it) and
// write only their own Node's kelp annotations and their own node's
// local-path volumes: with one node's controller credentials another
// node's addresses, overlay annotations, labels or schedulability cannot
// be changed, nor its volumes made or deleted, nor a volume pre-bound to
// a claim the scheduler did not place on that node.
func TestNodeControllerIdentity(t *testing.T) {
	t.Parallel()
	srv, agent := serverAndAgent(t, nil)
	admin := srv.Client()
	waitNodesReady(t, admin, 2)
	ctx := context.Background()
	c := controllerClient(t, agent)

	review, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("whoami with agent-1's controller credentials: %v", err)
	}
	if u := review.Status.UserInfo; u.Username != "system:kelp-controller:agent-1" || !slices.Contains(u.Groups, "system:kelp-controllers") {
		t.Errorf("agent-1's controllers are %s in %v, want system:kelp-controller:agent-1 in system:kelp-controllers", u.Username, u.Groups)
	}

	patchNode := func(node string, patch map[string]any) error {
		data, err := json.Marshal(patch)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, data, metav1.PatchOptions{})
		return err
	}
	annotate := func(key string, value any) map[string]any {
		return map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: value}}}
	}
	before, err := admin.CoreV1().Nodes().Get(ctx, "server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The policies are in force once the apiserver has loaded them.
	testcluster.Eventually(t, "agent-1's controllers refused an overlay annotation on the server's Node", func() (bool, error) {
		err := patchNode("server", annotate("overlay.kelp.io/identity-test", "agent-1"))
		if err == nil {
			_ = patchNode("server", annotate("overlay.kelp.io/identity-test", nil))
		}
		return apierrors.IsForbidden(err), nil
	})
	for _, tc := range []struct {
		what  string
		node  string
		patch map[string]any
	}{
		{"the server's provided node IP", "server", annotate("alpha.kubernetes.io/provided-node-ip", "10.99.0.3")},
		{"the server's overlay public IP", "server", annotate("overlay.kelp.io/public-ip", "10.99.0.3")},
		{"the server's schedulability", "server", map[string]any{"spec": map[string]any{"unschedulable": true}}},
		{"its own provided node IP", "agent-1", annotate("alpha.kubernetes.io/provided-node-ip", "10.99.0.2")},
		{"its own node-restriction label", "agent-1", map[string]any{"metadata": map[string]any{"labels": map[string]any{"node-restriction.kubernetes.io/identity-test": "x"}}}},
		{"its own servicelb label", "agent-1", map[string]any{"metadata": map[string]any{"labels": map[string]any{"svccontroller.kelp.io/enablelb": "true"}}}},
		{"its own schedulability", "agent-1", map[string]any{"spec": map[string]any{"unschedulable": true}}},
		{"its own taints", "agent-1", map[string]any{"spec": map[string]any{"taints": []any{map[string]any{"key": "identity-test", "effect": "NoSchedule"}}}}},
	} {
		if err := patchNode(tc.node, tc.patch); !apierrors.IsForbidden(err) {
			t.Errorf("agent-1's controllers changing %s: %v, want forbidden", tc.what, err)
		}
	}
	for _, value := range []any{"agent-1", nil} {
		if err := patchNode("agent-1", annotate("overlay.kelp.io/identity-test", value)); err != nil {
			t.Errorf("agent-1's controllers setting an overlay annotation of their own Node to %v: %v", value, err)
		}
	}
	after, err := admin.CoreV1().Nodes().Get(ctx, "server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"overlay.kelp.io/public-ip", "alpha.kubernetes.io/provided-node-ip"} {
		if before.Annotations[k] != after.Annotations[k] {
			t.Errorf("agent-1's controllers changed the server's %s from %q to %q", k, before.Annotations[k], after.Annotations[k])
		}
	}
	if after.Spec.Unschedulable {
		t.Error("agent-1's controllers cordoned the server")
	}

	volume := func(name, labelled, affinity string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kelp.io/local-path-node": labelled}},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")},
				PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/var/lib/identity-test"}},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				StorageClassName:              "identity-test",
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{affinity}}},
				}}}},
			},
		}
	}
	for _, v := range []*corev1.PersistentVolume{volume("identity-server", "server", "server"), volume("identity-mixed", "agent-1", "server")} {
		if _, err := c.CoreV1().PersistentVolumes().Create(ctx, v, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("agent-1's controllers creating volume %s (labelled %s, node affinity %v): %v, want forbidden",
				v.Name, v.Labels["kelp.io/local-path-node"], v.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values, err)
		}
	}
	if _, err := admin.CoreV1().PersistentVolumes().Create(ctx, volume("identity-server", "server", "server"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().PersistentVolumes().Delete(ctx, "identity-server", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("agent-1's controllers deleting the server's volume: %v, want forbidden", err)
	}
	if _, err := admin.CoreV1().PersistentVolumes().Create(ctx, volume("identity-agent", "agent-1", "agent-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().PersistentVolumes().Delete(ctx, "identity-agent", metav1.DeleteOptions{}); err != nil {
		t.Errorf("agent-1's controllers deleting a volume of their own node: %v", err)
	}

	// A node's volume pre-bound to a claim binds it, and the claim's pod
	// follows the volume to that node: a node may make volumes only for
	// the claims the scheduler placed on it (the volumes webhook). Here
	// agent-1 tries to pull another namespace's pending claims to itself.
	claim := func(namespace, name, placedOn string) *corev1.PersistentVolumeClaim {
		cl := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To("local-path"),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
			},
		}
		if placedOn != "" {
			cl.Annotations = map[string]string{"volume.kubernetes.io/selected-node": placedOn}
		}
		created, err := admin.CoreV1().PersistentVolumeClaims(namespace).Create(ctx, cl, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return created
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "identity-victim"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, placedOn, refusal string }{
		{"waiting", "", "the scheduler has not placed claim identity-victim/waiting on a node"},
		{"elsewhere", "elsewhere", "the scheduler placed claim identity-victim/elsewhere on node elsewhere"},
	} {
		victim := claim("identity-victim", tc.name, tc.placedOn)
		steal := volume("identity-steal-"+tc.name, "agent-1", "agent-1")
		steal.Spec.StorageClassName = "local-path"
		steal.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: victim.Namespace, Name: victim.Name, UID: victim.UID}
		_, err := c.CoreV1().PersistentVolumes().Create(ctx, steal, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `admission webhook "volumes.node-controllers.kelp.io" denied the request`) || !strings.Contains(err.Error(), tc.refusal) {
			t.Errorf("agent-1's controllers pre-binding a volume to claim identity-victim/%s (placed on %q): %v, want forbidden by the volumes webhook: %s", tc.name, tc.placedOn, err, tc.refusal)
		}
		if _, err := admin.CoreV1().PersistentVolumes().Get(ctx, steal.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("volume %s after the refusal: %v, want none", steal.Name, err)
		}
	}
	// What the scheduler placed on agent-1, agent-1 provisions: through
	// the same webhook, as its controllers.
	own := claim("default", "identity-own", "agent-1")
	testcluster.Eventually(t, "agent-1 provisioning a claim placed on it", func() (bool, error) {
		got, err := admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, own.Name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.ClaimBound && got.Spec.VolumeName == "pvc-"+string(own.UID), err
	})
	if err := admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}

	// The identity all nodes shared before holds no grant any more.
	sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:kelp-controller",
		Groups:             []string{"system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "patch", Resource: "nodes", Name: "server"},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sar.Status.Allowed {
		t.Errorf("the shared system:kelp-controller identity may still patch Nodes: %+v", sar.Status)
	}

	// Each node's gateway data path reads the one Secret that holds its
	// config, and no other.
	for _, tc := range []struct {
		verb, name string
		allowed    bool
	}{
		{"get", "kelp-gateway", true},
		{"watch", "kelp-gateway", true},
		{"get", "kelp-gateway-other", false},
		{"list", "", false},
	} {
		sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:kelp-controller:agent-1",
			Groups:             []string{"system:kelp-controllers", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: tc.verb, Resource: "secrets", Namespace: "kube-system", Name: tc.name},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != tc.allowed {
			t.Errorf("agent-1's controllers may %s Secret kube-system/%s: %v, want %v", tc.verb, tc.name, sar.Status.Allowed, tc.allowed)
		}
	}

	// The controller-manager type-checks the policies against the Node and
	// PersistentVolume schemas: a mistyped field would fail every request.
	for _, name := range []string{systemobjects.NodesPolicy, systemobjects.VolumesPolicy} {
		testcluster.Eventually(t, "the type check of policy "+name, func() (bool, error) {
			p, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.TypeChecking == nil {
				return false, nil
			}
			for _, w := range p.Status.TypeChecking.ExpressionWarnings {
				t.Errorf("policy %s: %s: %s", name, w.FieldRef, w.Warning)
			}
			return true, nil
		})
	}

	t.Run("a node holding the shared identity gets its own at its next start", func(t *testing.T) {
		files := pki.NodeFilesIn(layout.Agent(agent.DataDir).TLS)
		writeSharedControllerCert(t, pki.FilesIn(layout.Server(srv.DataDir).TLS).ClientCA, files.Controller)
		shared := controllerClient(t, agent)
		if review, err := shared.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{}); err != nil || review.Status.UserInfo.Username != "system:kelp-controller" {
			t.Fatalf("whoami with the shared identity: %v %+v", err, review)
		}
		data, _ := json.Marshal(annotate("overlay.kelp.io/identity-test", "shared"))
		if _, err := shared.CoreV1().Nodes().Patch(ctx, "agent-1", types.MergePatchType, data, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the shared identity annotating agent-1: %v, want forbidden", err)
		}
		agent.Stop()
		agent.StartAgent(srv.URL(), srv.TokenFile())
		agent.WaitLog("kelp node is running", startTimeout)
		review, err := controllerClient(t, agent).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil || review.Status.UserInfo.Username != "system:kelp-controller:agent-1" {
			t.Errorf("whoami after the restart: %v %+v", err, review)
		}
	})
}

// writeSharedControllerCert writes to dst a certificate of the identity
// every node's controllers shared before each node had its own, signed by
// the client CA ca, as kelp issued it then.
func writeSharedControllerCert(t *testing.T, ca, dst pki.Pair) {
	t.Helper()
	writeLeaf(t, ca, dst, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "system:kelp-controller"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// writeLeaf writes to dst a new key and a certificate of it from
// template, valid for an hour, signed by the CA ca.
func writeLeaf(t *testing.T, ca, dst pki.Pair, template *x509.Certificate) {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(ca.Cert, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template.SerialNumber = big.NewInt(time.Now().UnixNano())
	template.NotBefore, template.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	template.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, template, caCert, &key.PublicKey, pair.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// The key first: a reader of the pair in between sees a mismatch, and
	// tries again when the certificate follows.
	for _, f := range []struct {
		path string
		data []byte
	}{
		{dst.Key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})},
		{dst.Cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})},
	} {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
