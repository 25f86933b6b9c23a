package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestAuditAndPodSecurity runs a server with an audit log and the
// restricted Pod Security default: a create is logged (without the
// object's data), a privileged pod is refused in default and admitted in
// kube-system; anonymous requests reach only the paths that need them.
func TestAuditAndPodSecurity(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	auditLog := filepath.Join(n.Dir, "audit", "audit.log")
	n.Start("--audit-log-path", auditLog, "--pod-security-default", "restricted")
	n.WaitReady(startTimeout)
	c := n.Client()
	ctx := context.Background()

	if _, err := c.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "audited"},
		Data:       map[string]string{"password": "do-not-log-me"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, "the create in the audit log", func() (bool, error) {
		data, _ := os.ReadFile(auditLog)
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, `"verb":"create"`) && strings.Contains(line, `"name":"audited"`) {
				return true, nil
			}
		}
		return false, nil
	})
	if data, _ := os.ReadFile(auditLog); strings.Contains(string(data), "do-not-log-me") {
		t.Error("the audit log holds a ConfigMap's data")
	}

	privileged := func(ns string) error {
		_, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "privileged"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "c", Image: testcluster.TestImage,
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
			}}},
		}, metav1.CreateOptions{})
		return err
	}
	waitServiceAccount(t, c, "default")
	if err := privileged("default"); err == nil || !strings.Contains(err.Error(), `violates PodSecurity "restricted:latest"`) {
		t.Errorf("a privileged pod in default: %v, want a Pod Security refusal", err)
	}
	waitServiceAccount(t, c, "kube-system")
	if err := privileged("kube-system"); err != nil {
		t.Errorf("a privileged pod in kube-system, which is exempt: %v", err)
	}

	// Requests without credentials reach the join API and the health
	// checks, and nothing else, whatever RBAC would grant them.
	anonymous := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: n.DialContext, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for path, want := range map[string]int{
		"/cacerts": http.StatusOK, "/ping": http.StatusOK, "/readyz": http.StatusOK, "/version": http.StatusOK,
		"/api": http.StatusUnauthorized, "/apis": http.StatusUnauthorized, "/openapi/v2": http.StatusUnauthorized,
	} {
		resp, err := anonymous.Get(n.URL() + path)
		if err != nil {
			t.Errorf("anonymous GET %s: %v", path, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("anonymous GET %s: %s, want %d", path, resp.Status, want)
		}
	}
}

// checkKubeletServing checks the serving certificate node's kubelet
// presents: it names the node and its address, not localhost, and only
// the kubelet CA verifies it, not the server CA the apiserver's clients
// trust.
func checkKubeletServing(t *testing.T, srv, node *testcluster.Node) {
	t.Helper()
	chain := kubeletChain(t, srv, node)
	leaf := chain[0]
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != node.Name || len(leaf.IPAddresses) != 1 || leaf.IPAddresses[0].String() != node.IP {
		t.Errorf("%s's kubelet serves for %v %v, want %s and %s alone", node.Name, leaf.DNSNames, leaf.IPAddresses, node.Name, node.IP)
	}
	certs := pki.FilesIn(layout.Server(srv.DataDir).TLS)
	if err := verifyChain(chain, firstCert(t, certs.KubeletCA.Cert)); err != nil {
		t.Errorf("%s's kubelet serving certificate against the kubelet CA: %v", node.Name, err)
	}
	if err := verifyChain(chain, firstCert(t, certs.ServerCA.Cert)); err == nil {
		t.Errorf("%s's kubelet serving certificate verifies against the server CA", node.Name)
	}
}

// kubeletChain is what node's kubelet presents to srv.
func kubeletChain(t *testing.T, srv, node *testcluster.Node) []*x509.Certificate {
	t.Helper()
	var chain []*x509.Certificate
	err := srv.InNetns(func() error {
		conn, err := tls.Dial("tcp", net.JoinHostPort(node.IP, "10250"), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return err
		}
		defer conn.Close()
		chain = conn.ConnectionState().PeerCertificates
		return nil
	})
	if err != nil {
		t.Fatalf("dial %s's kubelet: %v", node.Name, err)
	}
	return chain
}

// writeOldKubeletServing gives node's kubelet a serving certificate as
// kelp issued them before the kubelet CA: signed by the server CA ca, for
// localhost too.
func writeOldKubeletServing(t *testing.T, ca pki.Pair, node *testcluster.Node) {
	t.Helper()
	writeLeaf(t, ca, pki.NodeFilesIn(layout.Agent(node.DataDir).TLS).KubeletServing, &x509.Certificate{
		Subject:     pkix.Name{CommonName: node.Name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{node.Name, "localhost"},
		IPAddresses: []net.IP{net.ParseIP(node.IP), net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
	})
}
