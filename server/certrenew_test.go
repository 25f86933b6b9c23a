package server_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kelp-dev/kelp/internal/certrenew"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// renewalWorkload is a pod that starts after the first leaves expired: the
// scheduler and the controller-manager place it, and a Service in front of
// the web pods that the Service proxy and DNS learn of only then.
var renewalWorkload = testcluster.App{Name: "after-expiry"}.YAML() + `---
apiVersion: v1
kind: Service
metadata: {name: web-after-expiry}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`

// TestCertificateRenewal runs a server on embedded etcd with its node and
// an agent, with leaves that live 90 s, and checks that every leaf on both
// machines is renewed while kelp runs, and that the cluster works on, with
// no restart, once the first ones expired: the nodes' heartbeats (the
// kubelets' client certificates), logs and exec on the agent (the
// apiserver's kubelet client, the kubelet's serving certificate), a new
// Service through DNS and the Service proxy (their clients), a new pod
// (the scheduler's and the controller-manager's), and the admin
// kubeconfig.
func TestCertificateRenewal(t *testing.T) {
	t.Parallel()
	const lifetime = 90 * time.Second
	env := []string{certrenew.TestLifetimeEnv + "=" + lifetime.String()}
	srv, agent := serverAndAgent(t, env, "--cluster-init")

	leaves := append(pki.FilesIn(layout.Server(srv.DataDir).TLS).Leaves(), pki.NodeFilesIn(layout.Agent(agent.DataDir).TLS).Leaves()...)
	first := readLeaves(t, leaves)
	var expiry time.Time
	for path, l := range first {
		if life := l.NotAfter.Sub(l.NotBefore); life > lifetime+2*time.Hour {
			t.Fatalf("%s lives %s, want %s", path, life, lifetime)
		}
		if l.NotAfter.After(expiry) {
			expiry = l.NotAfter
		}
	}
	admin, err := os.ReadFile(srv.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}

	// The test makes a client anew for each step: one made from the admin
	// kubeconfig stops working when the certificate it embeds expires.
	waitNodesReady(t, srv.Client(), 2)
	waitServiceAccount(t, srv.Client(), "default")
	apply(t, srv, spreadWorkload)
	rolloutStatus(t, srv, "daemonset/web", 170*time.Second)

	// Every leaf is renewed, some more than once, until the first ones
	// are all past their expiry.
	testcluster.EventuallyWithin(t, time.Until(expiry.Add(lifetime)), "every leaf renewed once the first ones expired", func() (bool, error) {
		now := readLeaves(t, leaves)
		var stale []string
		for path, l := range first {
			if now[path].SerialNumber.Cmp(l.SerialNumber) == 0 {
				stale = append(stale, path)
			}
		}
		return len(stale) == 0 && time.Now().After(expiry.Add(5*time.Second)), fmt.Errorf("not renewed: %s", strings.Join(stale, ", "))
	})
	t.Logf("the first leaves expired at %s", expiry.Format(time.TimeOnly))

	t.Run("admin kubeconfig", func(t *testing.T) {
		if now, err := os.ReadFile(srv.Kubeconfig); err != nil || string(now) == string(admin) {
			t.Errorf("%s was not written again with the renewed certificate: %v", srv.Kubeconfig, err)
		}
		if _, err := srv.Client().CoreV1().Nodes().List(context.Background(), metav1.ListOptions{}); err != nil {
			t.Errorf("the admin kubeconfig: %v", err)
		}
	})
	t.Run("node heartbeats", func(t *testing.T) {
		for _, name := range []string{srv.Name, agent.Name} {
			testcluster.Eventually(t, name+"'s lease renewed after the expiry", func() (bool, error) {
				l, err := srv.Client().CoordinationV1().Leases("kube-node-lease").Get(context.Background(), name, metav1.GetOptions{})
				return err == nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(expiry), nil
			})
		}
		waitNodesReady(t, srv.Client(), 2)
	})
	pods := podsByNode(t, srv.Client(), "app=web")
	t.Run("logs and exec on the agent", func(t *testing.T) {
		// The first connection the apiserver opens to a kubelet after its
		// kubelet client certificate was renewed may fail: client-go sees
		// the new certificate in that connection's handshake and closes
		// every connection it made, that one too (cert_rotation.go).
		// Once; then it has the new one.
		twice := func(args ...string) (string, error) {
			out, err := srv.Kubectl(args...)
			if err != nil && strings.Contains(out, "use of closed network connection") {
				t.Logf("kubectl %s, first try: %s", args[0], out)
				out, err = srv.Kubectl(args...)
			}
			return out, err
		}
		if out, err := twice("logs", pods[agent.Name].Name); err != nil || !strings.Contains(out, "serving on :8080") {
			t.Errorf("logs: %q %v", out, err)
		}
		if out, err := twice("exec", pods[agent.Name].Name, "--", "/testapp", "cat", "/etc/hostname"); err != nil || strings.TrimSpace(out) != pods[agent.Name].Name {
			t.Errorf("exec: %q %v", out, err)
		}
	})
	t.Run("a new pod and a new Service", func(t *testing.T) {
		apply(t, srv, renewalWorkload)
		rolloutStatus(t, srv, "deployment/after-expiry", 110*time.Second)
		testcluster.Eventually(t, "the new Service by its DNS name from the agent", func() (bool, error) {
			out, err := srv.Kubectl("exec", pods[agent.Name].Name, "--", "/testapp", "get", "http://web-after-expiry.default.svc.cluster.local/", "3s")
			return err == nil && strings.HasPrefix(out, "web-"), nil
		})
	})
	t.Run("kelp certificate check", func(t *testing.T) {
		for _, n := range []*testcluster.Node{srv, agent} {
			// A leaf may be due this very second; none may be expired.
			out, err := n.RunKelp(time.Minute, "certificate", "check", "--data-dir", n.DataDir)
			if code := testcluster.ExitCode(err); err != nil && code != 2 || strings.Contains(out, pki.StatusExpired) {
				t.Errorf("%s: exit %d\n%s", n.Name, code, out)
			}
		}
	})
	t.Run("no client was refused", func(t *testing.T) {
		for _, n := range []*testcluster.Node{srv, agent} {
			for _, line := range strings.Split(n.Log(), "\n") {
				if strings.Contains(line, "certificate has expired") || strings.Contains(line, "Unauthorized") {
					t.Errorf("%s logged: %s", n.Name, line)
				}
			}
		}
	})
}

// readLeaves reads the certificates at the leaves' paths.
func readLeaves(t *testing.T, leaves []pki.Pair) map[string]*x509.Certificate {
	t.Helper()
	out := map[string]*x509.Certificate{}
	for _, p := range leaves {
		data, err := os.ReadFile(p.Cert)
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(data)
		if block == nil {
			t.Fatalf("%s: no PEM", p.Cert)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(fmt.Errorf("%s: %w", p.Cert, err))
		}
		out[p.Cert] = cert
	}
	return out
}
