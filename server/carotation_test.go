package server_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestCARotation runs a server and a joined agent with a pod on each,
// rotates the cluster's CAs (generated) and finishes the rotation, each
// step on the stopped server, and checks that the agent, never joined
// again nor restarted, picks up the new CAs by itself and keeps working
// throughout: it stays Ready, runs new pods, serves logs and exec, and
// after the finish its certificates and the apiserver's verify against
// the new CAs only.
func TestCARotation(t *testing.T) {
	t.Parallel()
	srv, agent := serverAndAgent(t, nil)
	waitNodesReady(t, srv.Client(), 2)
	waitServiceAccount(t, srv.Client(), "default")
	apply(t, srv, spreadWorkload)
	rolloutStatus(t, srv, "daemonset/web", 170*time.Second)

	server := pki.FilesIn(layout.Server(srv.DataDir).TLS)
	node := pki.NodeFilesIn(layout.Agent(agent.DataDir).TLS)
	oldServerCA, oldClientCA := firstCert(t, server.ServerCA.Cert), firstCert(t, server.ClientCA.Cert)
	oldKubeletCA := firstCert(t, server.KubeletCA.Cert)

	restartWith := func(args ...string) {
		t.Helper()
		srv.Stop()
		if out, err := srv.RunKelp(time.Minute, append([]string{"certificate"}, args...)...); err != nil {
			t.Fatalf("kelp certificate %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		srv.Start()
		srv.WaitReady(startTimeout)
	}

	restartWith("rotate-ca", "--data-dir", srv.DataDir)
	newServerCA, newClientCA := firstCert(t, server.ServerCA.Cert), firstCert(t, server.ClientCA.Cert)
	newKubeletCA := firstCert(t, server.KubeletCA.Cert)
	if newServerCA.Equal(oldServerCA) || newClientCA.Equal(oldClientCA) || newKubeletCA.Equal(oldKubeletCA) {
		t.Fatal("rotate-ca left the CAs as they were")
	}
	// The agent notices the new server CA bundle and renews: its client
	// certificate comes from the new client CA.
	testcluster.EventuallyWithin(t, 4*time.Minute, "the agent's certificates from the new CAs", func() (bool, error) {
		c := firstCert(t, node.KubeletClient.Cert)
		return bytes.Equal(c.RawIssuer, newClientCA.RawSubject) && sameFile(t, node.ServerCA, server.ServerCA.Cert), nil
	})
	renewed := time.Now()
	agentWorks(t, srv, agent, "during-rotation")
	if out, err := agent.RunKelp(time.Minute, "certificate", "check", "--data-dir", agent.DataDir); err != nil ||
		!strings.Contains(out, newServerCA.Subject.CommonName+" (CA; also trusts "+oldServerCA.Subject.CommonName) {
		t.Errorf("kelp certificate check on the agent during the rotation: %v\n%s", err, out)
	}

	// client-go re-reads a CA file at most every five minutes: the agent's
	// clients trust the new CA alone only after that.
	time.Sleep(time.Until(renewed.Add(5*time.Minute + 30*time.Second)))
	restartWith("rotate-ca", "--finish", "--data-dir", srv.DataDir)
	testcluster.EventuallyWithin(t, 4*time.Minute, "the agent's CA bundle without the old CA", func() (bool, error) {
		return sameFile(t, node.ServerCA, server.ServerCA.Cert) && sameFile(t, node.ClientCA, server.ClientCA.Cert), nil
	})
	if certs := readCerts(t, server.ServerCA.Cert); len(certs) != 1 {
		t.Fatalf("after --finish, the server CA file holds %d certificates", len(certs))
	}
	agentWorks(t, srv, agent, "after-rotation")

	t.Run("only the new CAs verify", func(t *testing.T) {
		var served []*x509.Certificate
		err := srv.InNetns(func() error {
			conn, err := tls.Dial("tcp", "127.0.0.1:6443", &tls.Config{InsecureSkipVerify: true})
			if err != nil {
				return err
			}
			defer conn.Close()
			served = conn.ConnectionState().PeerCertificates
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		agentClient := readCerts(t, node.KubeletClient.Cert)
		for _, tc := range []struct {
			what     string
			chain    []*x509.Certificate
			old, new *x509.Certificate
		}{
			{"the apiserver's serving certificate", served, oldServerCA, newServerCA},
			{"the agent's client certificate", agentClient, oldClientCA, newClientCA},
			{"the agent's kubelet serving certificate", kubeletChain(t, srv, agent), oldKubeletCA, newKubeletCA},
		} {
			if !bytes.Equal(tc.chain[0].RawIssuer, tc.new.RawSubject) {
				t.Errorf("%s is issued by %s, want %s", tc.what, tc.chain[0].Issuer, tc.new.Subject)
			}
			if err := verifyChain(tc.chain, tc.new); err != nil {
				t.Errorf("%s against the new CA: %v", tc.what, err)
			}
			if err := verifyChain(tc.chain, tc.old); err == nil {
				t.Errorf("%s still verifies against the old CA", tc.what)
			}
		}
	})
	t.Run("the agent was never joined again", func(t *testing.T) {
		if n := strings.Count(agent.Log(), "kelp node is running"); n != 1 {
			t.Errorf("the agent started %d times", n)
		}
		if !agent.Logged("the cluster's CAs changed") {
			t.Error("the agent did not log that it picked up the new CAs")
		}
	})
}

// agentWorks checks the agent: Ready, a new pod on it, logs and exec to
// its pod through the apiserver, and the admin kubeconfig.
func agentWorks(t *testing.T, srv, agent *testcluster.Node, name string) {
	t.Helper()
	waitNodesReady(t, srv.Client(), 2)
	apply(t, srv, testcluster.App{Name: name, Node: "agent-1"}.YAML()) // must start on the agent
	rolloutStatus(t, srv, "deployment/"+name, 170*time.Second)
	pod := podsByNode(t, srv.Client(), "app="+name)[agent.Name]
	if pod.Name == "" {
		t.Fatalf("no %s pod on %s", name, agent.Name)
	}
	// The first connection the apiserver opens to a kubelet after a
	// certificate changed may fail once (see TestCertificateRenewal).
	retry := func(args ...string) (string, error) {
		var out string
		var err error
		for range 3 {
			if out, err = srv.Kubectl(args...); err == nil {
				break
			}
			t.Logf("kubectl %s: %s", args[0], out)
			time.Sleep(2 * time.Second)
		}
		return out, err
	}
	if out, err := retry("logs", pod.Name); err != nil || !strings.Contains(out, "serving on :8080") {
		t.Errorf("%s: logs: %q %v", name, out, err)
	}
	if out, err := retry("exec", pod.Name, "--", "/testapp", "cat", "/etc/hostname"); err != nil || strings.TrimSpace(out) != pod.Name {
		t.Errorf("%s: exec: %q %v", name, out, err)
	}
}

func readCerts(t *testing.T, path string) []*x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []*x509.Certificate
	for {
		var block *pem.Block
		if block, data = pem.Decode(data); block == nil {
			break
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no certificate", path)
	}
	return out
}

func firstCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	return readCerts(t, path)[0]
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	x, errA := os.ReadFile(a)
	y, errB := os.ReadFile(b)
	return errA == nil && errB == nil && bytes.Equal(x, y)
}

// verifyChain verifies chain[0] against root alone, with the rest of
// chain as intermediates.
func verifyChain(chain []*x509.Certificate, root *x509.Certificate) error {
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(root)
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}
