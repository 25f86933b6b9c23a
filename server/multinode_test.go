package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/testcluster"
	"github.com/kelp-dev/kelp/internal/token"
)

// spreadWorkload puts one web pod on every node, behind a NodePort
// Service, and a client pod on each agent.
var spreadWorkload = testcluster.App{Kind: "DaemonSet", Name: "web", Ready: true}.YAML() + `---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080, nodePort: 30100}]
`

// The server is away for a minute once, and briefly in the other run, to
// keep the suite short.
func TestMultiNodeVXLAN(t *testing.T) {
	t.Parallel()
	testMultiNode(t, "vxlan", time.Minute)
}

func TestMultiNodeHostGW(t *testing.T) {
	t.Parallel()
	testMultiNode(t, "host-gw", 5*time.Second)
}

// testMultiNode runs a server and two agents in a lab with the overlay
// backend, and checks pods on different nodes reach each other, by pod IP
// and through a Service by DNS name; NodePorts on every node; logs and
// exec on an agent; a second machine claiming a node's name; the server
// away for the time away; an agent restart that keeps its pods; and a
// deleted node's routes going away.
func testMultiNode(t *testing.T, backend string, away time.Duration) {
	lab := testcluster.NewLab(t)
	image := testcluster.BuildTestImage(t, testcluster.TestImage)
	node := func(name, ip string) *testcluster.Node {
		n := lab.NewNode(name, ip)
		n.AddImage(image)
		return n
	}
	srv := node("server", "10.99.0.2")
	srv.Agent = true
	srv.Start("--overlay", backend)
	srv.WaitReady(startTimeout)
	srv.WaitLog("kelp node is running", startTimeout)
	agents := []*testcluster.Node{node("agent-1", "10.99.0.3"), node("agent-2", "10.99.0.4")}
	// agent-1 joins with the server's token, agent-2 with one of
	// `kelp token create`.
	created, err := srv.RunKelp(time.Minute, "token", "create", "--data-dir", srv.DataDir, "--ttl", "1h", "--description", "for agent-2")
	if err != nil || !strings.HasPrefix(created, "KELP1") {
		t.Fatalf("kelp token create: %v\n%s", err, created)
	}
	createdFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(createdFile, []byte(created), 0o600); err != nil {
		t.Fatal(err)
	}
	agents[0].StartAgent(srv.URL(), srv.TokenFile())
	agents[1].StartAgent(srv.URL(), createdFile, "--node-external-ip", "203.0.113.4")
	for _, a := range agents {
		a.WaitLog("kelp node is running", startTimeout)
	}
	c := srv.Client()
	waitNodesReady(t, c, 3)
	testcluster.Eventually(t, "agent-2's addresses, its external IP too", func() (bool, error) {
		node, err := c.CoreV1().Nodes().Get(context.Background(), "agent-2", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		want := map[corev1.NodeAddress]bool{{Type: corev1.NodeInternalIP, Address: "10.99.0.4"}: true, {Type: corev1.NodeExternalIP, Address: "203.0.113.4"}: true}
		for _, a := range node.Status.Addresses {
			delete(want, a)
		}
		return len(want) == 0, nil
	})
	// Agents reach the apiserver through their own load balancer.
	if kc, err := os.ReadFile(filepath.Join(agents[0].DataDir, "agent", "kubelet.kubeconfig")); err != nil || !strings.Contains(string(kc), "https://127.0.0.1:6444") {
		t.Errorf("the agent's kubelet does not go through its load balancer: %v\n%s", err, kc)
	}
	waitServiceAccount(t, c, "default")
	apply(t, srv, spreadWorkload)
	rolloutStatus(t, srv, "daemonset/web", 170*time.Second)
	pods := podsByNode(t, c, "app=web")
	if len(pods) != 3 {
		t.Fatalf("web pods on %d nodes, want 3: %v", len(pods), pods)
	}
	exec := func(on string, args ...string) (string, error) {
		out, err := srv.Kubectl(append([]string{"exec", pods[on].Name, "--"}, args...)...)
		return strings.TrimSpace(out), err
	}

	t.Run("pod to pod across nodes", func(t *testing.T) {
		for from := range pods {
			for to, p := range pods {
				if from == to {
					continue
				}
				testcluster.Eventually(t, fmt.Sprintf("%s reaches the pod on %s", from, to), func() (bool, error) {
					out, err := exec(from, "/testapp", "get", "http://"+p.Status.PodIP+":8080/", "3s")
					return err == nil && strings.HasPrefix(out, p.Name+" "+pods[from].Status.PodIP+":"), nil
				})
			}
		}
	})
	t.Run("service by DNS name from an agent", func(t *testing.T) {
		seen := map[string]bool{}
		for i := 0; i < 60 && len(seen) < 3; i++ {
			if out, err := exec("agent-1", "/testapp", "get", "http://web.default.svc.cluster.local/", "3s"); err == nil {
				seen[strings.Fields(out)[0]] = true
			}
		}
		if len(seen) != 3 {
			t.Errorf("answered by %v, want the pods of all 3 nodes", seen)
		}
	})
	t.Run("NodePort on every node", func(t *testing.T) {
		client := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: srv.DialContext, DisableKeepAlives: true}}
		for _, n := range append([]*testcluster.Node{srv}, agents...) {
			testcluster.Eventually(t, "the NodePort of "+n.Name, func() (bool, error) {
				resp, err := client.Get("http://" + n.IP + ":30100/")
				if err != nil {
					return false, nil
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				return strings.HasPrefix(string(body), "web-"), nil
			})
		}
	})
	t.Run("logs and exec on an agent", func(t *testing.T) {
		if out := kubectl(t, srv, "logs", pods["agent-2"].Name); !strings.Contains(out, "serving on :8080") {
			t.Errorf("logs: %q", out)
		}
		if out, err := exec("agent-2", "/testapp", "cat", "/etc/hostname"); err != nil || out != pods["agent-2"].Name {
			t.Errorf("exec: %q %v", out, err)
		}
		// The apiserver verified the kubelet by the kubelet CA: the
		// server CA, which the apiserver's clients trust, does not
		// vouch for a node's serving certificate.
		checkKubeletServing(t, srv, agents[1])
	})
	impostor := lab.NewNode("impostor", "10.99.0.5")
	join := func(tokenFile, name string) (string, error) {
		return impostor.RunKelp(time.Minute, "agent", "--server", srv.URL(), "--token-file", tokenFile,
			"--data-dir", impostor.DataDir, "--node-name", name, "--node-ip", impostor.IP)
	}
	t.Run("a second machine cannot take a node's name", func(t *testing.T) {
		out, err := join(srv.TokenFile(), "agent-1")
		if testcluster.ExitCode(err) != 1 || !strings.Contains(out, "kubectl delete node agent-1") {
			t.Errorf("exit %d:\n%s", testcluster.ExitCode(err), out)
		}
	})
	t.Run("a node gets no serving certificate for the apiserver", func(t *testing.T) {
		many := make([]string, 200)
		for i := range many {
			many[i] = fmt.Sprintf("10.98.%d.%d", i/250, 1+i%250)
		}
		for ips, want := range map[string]string{
			"10.43.0.1": "10.43.0.1 (an address of the apiserver)",
			"10.99.0.2": "10.99.0.2 (an address of the apiserver)",
			// kelp refuses this itself; the join API's limit of 16, for
			// other clients, is TestIssueNodeRefusesNamesNotTheNodes's (pki) and
			// TestJoinServingCertificateNames's (joinapi).
			strings.Join(many, ","): "give at most one address of each family",
		} {
			out, err := impostor.RunKelp(time.Minute, "agent", "--server", srv.URL(), "--token-file", srv.TokenFile(),
				"--data-dir", impostor.DataDir, "--node-name", "impostor", "--node-ip", ips)
			if testcluster.ExitCode(err) != 1 || !strings.Contains(out, want) {
				t.Errorf("a join asking for %.40s: exit %d, want 1 and %q:\n%s", ips, testcluster.ExitCode(err), want, out)
			}
		}
	})
	t.Run("tokens listed, rotated and deleted", func(t *testing.T) {
		parsed, err := token.Parse(created, token.NodeUser)
		if err != nil {
			t.Fatal(err)
		}
		id, _, _ := strings.Cut(parsed.Secret, ".")
		if out, err := srv.RunKelp(time.Minute, "token", "list", "--data-dir", srv.DataDir); err != nil || !strings.Contains(out, id) || !strings.Contains(out, "for agent-2") {
			t.Errorf("kelp token list lacks %s: %v\n%s", id, err, out)
		}
		old := filepath.Join(t.TempDir(), "old-token")
		copyFile(t, srv.TokenFile(), old)
		if out, err := srv.RunKelp(time.Minute, "token", "rotate", "--data-dir", srv.DataDir); err != nil {
			t.Fatalf("kelp token rotate: %v\n%s", err, out)
		}
		if out, err := join(old, "newcomer"); testcluster.ExitCode(err) != 1 || !strings.Contains(out, "the token is not valid") {
			t.Errorf("the rotated-out token still joins: exit %d\n%s", testcluster.ExitCode(err), out)
		}
		if out, err := srv.RunKelp(time.Minute, "token", "delete", "--data-dir", srv.DataDir, id); err != nil {
			t.Fatalf("kelp token delete: %v\n%s", err, out)
		}
		if out, err := join(createdFile, "newcomer"); testcluster.ExitCode(err) != 1 || !strings.Contains(out, "the token is not valid") {
			t.Errorf("a deleted token still joins: exit %d\n%s", testcluster.ExitCode(err), out)
		}
	})
	t.Run("the server away and back", func(t *testing.T) {
		srv.Stop()
		// Pods on the agents go on talking without it.
		target := pods["agent-2"]
		client := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: agents[0].DialContext, DisableKeepAlives: true}}
		deadline := time.Now().Add(away)
		for {
			resp, err := client.Get("http://" + target.Status.PodIP + ":8080/")
			if err != nil {
				t.Fatalf("agent-1 lost the pod on agent-2 while the server was away: %v", err)
			}
			resp.Body.Close()
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Second)
		}
		// The server comes back as a kelp from before the kubelet CA
		// upgraded: the agents' kubelets serve certificates of the server
		// CA, and it has no kubelet CA yet.
		serverTLS := pki.FilesIn(layout.Server(srv.DataDir).TLS)
		for _, a := range agents {
			writeOldKubeletServing(t, serverTLS.ServerCA, a)
		}
		for _, f := range []string{serverTLS.KubeletCA.Cert, serverTLS.KubeletCA.Key} {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		srv.Start("--overlay", backend)
		srv.WaitReady(startTimeout)
		waitNodesReady(t, c, 3)
		if after := podsByNode(t, c, "app=web"); after["agent-2"].Name != target.Name {
			t.Errorf("the pod on agent-2 was replaced while the server was away: %s", after["agent-2"].Name)
		}
		// Until they restart, the apiserver verifies them by the server CA.
		if err := verifyChain(kubeletChain(t, srv, agents[0]), firstCert(t, serverTLS.ServerCA.Cert)); err != nil {
			t.Fatalf("agent-1's kubelet does not serve its certificate of the server CA: %v", err)
		}
		testcluster.Eventually(t, "logs of the pod on agent-1, whose kubelet serves a certificate of the server CA", func() (bool, error) {
			out, err := srv.Kubectl("logs", pods["agent-1"].Name)
			return err == nil && strings.Contains(out, "serving on :8080"), nil
		})
	})
	t.Run("agent restart keeps its pods", func(t *testing.T) {
		before := pods["agent-1"].Status.ContainerStatuses[0].ContainerID
		agents[0].Stop()
		agents[0].StartAgent(srv.URL(), srv.TokenFile())
		agents[0].WaitLog("kelp node is running", startTimeout)
		waitNodesReady(t, c, 3)
		after := podsByNode(t, c, "app=web")["agent-1"]
		if after.Name != pods["agent-1"].Name || len(after.Status.ContainerStatuses) == 0 || after.Status.ContainerStatuses[0].ContainerID != before {
			t.Errorf("the pod on agent-1 changed across the restart: %s %v", after.Name, after.Status.ContainerStatuses)
		}
		// Its join at start gave it a serving certificate of the kubelet CA.
		checkKubeletServing(t, srv, agents[0])
		testcluster.Eventually(t, "exec on agent-1 after its restart", func() (bool, error) {
			out, err := exec("agent-1", "/testapp", "cat", "/etc/hostname")
			return err == nil && out == pods["agent-1"].Name, nil
		})
	})
	t.Run("a deleted node's routes go", func(t *testing.T) {
		gone := agents[1]
		node, err := c.CoreV1().Nodes().Get(context.Background(), gone.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cidr := node.Spec.PodCIDR
		hasRoute := func(n *testcluster.Node) bool {
			out, err := n.Run(time.Minute, n.Command("ip", "route", "show", cidr))
			return err == nil && strings.TrimSpace(out) != ""
		}
		if !hasRoute(srv) || !hasRoute(agents[0]) {
			t.Fatalf("no route to %s's pod CIDR %s to begin with", gone.Name, cidr)
		}
		gone.Stop()
		kubectl(t, srv, "delete", "node", gone.Name)
		testcluster.Eventually(t, "the routes to "+cidr+" gone", func() (bool, error) {
			return !hasRoute(srv) && !hasRoute(agents[0]), nil
		})
	})
}

// serverAndAgent starts, in a lab of their own, a server that runs a node
// and an agent joined to it with the server's token, both with the test
// image and env, and waits until both nodes run.
func serverAndAgent(t *testing.T, env []string, serverArgs ...string) (srv, agent *testcluster.Node) {
	t.Helper()
	lab := testcluster.NewLab(t)
	image := testcluster.BuildTestImage(t, testcluster.TestImage)
	srv = lab.NewNode("server", "10.99.0.2")
	srv.Env = env
	srv.AddImage(image)
	agent = lab.NewNode("agent-1", "10.99.0.3")
	agent.Env = env
	agent.AddImage(image)
	startServerAndAgent(srv, agent, serverArgs...)
	return srv, agent
}

// startServerAndAgent starts srv as a server that runs a node, with
// serverArgs, then agent joined to it with srv's token, and waits until
// both nodes run.
func startServerAndAgent(srv, agent *testcluster.Node, serverArgs ...string) {
	startServerNode(srv, serverArgs...)
	agent.StartAgent(srv.URL(), srv.TokenFile())
	agent.WaitLog("kelp node is running", startTimeout)
}

// startServerNode starts srv as a server that runs a node, with args, and
// waits until its node runs.
func startServerNode(srv *testcluster.Node, args ...string) {
	srv.Agent = true
	srv.Start(args...)
	srv.WaitReady(startTimeout)
	srv.WaitLog("kelp node is running", startTimeout)
}

// waitNodesReady waits until there are count nodes, all Ready.
func waitNodesReady(t *testing.T, c kubernetes.Interface, count int) {
	t.Helper()
	testcluster.EventuallyWithin(t, startTimeout, fmt.Sprintf("%d nodes Ready", count), func() (bool, error) {
		nodes, err := c.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		if err != nil || len(nodes.Items) != count {
			return false, err
		}
		for _, n := range nodes.Items {
			if !slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
				return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
			}) {
				return false, fmt.Errorf("%s not Ready", n.Name)
			}
		}
		return true, nil
	})
}

// podsByNode maps node names to the pod of selector running there.
func podsByNode(t *testing.T, c kubernetes.Interface, selector string) map[string]corev1.Pod {
	t.Helper()
	list, err := c.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range list.Items {
		out[p.Spec.NodeName] = p
	}
	return out
}
