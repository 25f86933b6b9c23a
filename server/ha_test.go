package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// haAgentToken is server-1's --agent-token: a token that joins agents only.
const haAgentToken = "0123456789abcdef0123456789abcdef"

// haDaemonSet runs a pod on every node, servers too.
var haDaemonSet = testcluster.App{Kind: "DaemonSet", Name: "everywhere"}.YAML()

// everywherePod is haDaemonSet's pod on node.
func everywherePod(t *testing.T, c kubernetes.Interface, node string) corev1.Pod {
	t.Helper()
	pods, err := c.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=everywhere", FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
		t.Fatalf("the DaemonSet's pod on %s: %v, %v", node, pods, err)
	}
	return pods.Items[0]
}

// haWorkload is a web pod on the agent behind a ClusterIP Service.
var haWorkload = testcluster.App{Kind: "Pod", Name: "web", Node: "agent-1", Ready: true}.YAML() + `---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`

// TestHA moves a server's SQLite cluster to embedded etcd, then runs three
// servers on it and an agent: the second and third join through the first; stopping any one server in turn leaves
// the cluster serving writes and the agent's pod reachable through a
// Service, and the server catches up when it is back; deleting the first
// server's Node removes its etcd member for good, and it says so when it
// starts again; losing the majority stops writes, and --cluster-reset on
// the survivor brings the cluster back with every object written before,
// and it moves the cluster back to SQLite.
func TestHA(t *testing.T) {
	t.Parallel()
	lab := testcluster.NewLab(t)
	image := testcluster.BuildTestImage(t, testcluster.TestImage)
	s1, s2, s3 := lab.NewNode("server-1", "10.99.0.2"), lab.NewNode("server-2", "10.99.0.3"), lab.NewNode("server-3", "10.99.0.4")
	agent := lab.NewNode("agent-1", "10.99.0.5")
	agent.AddImage(image)

	// server-1 runs a node, so that `kubectl delete node` can retire it.
	// It starts on SQLite with a workload; --cluster-init then moves its
	// cluster to embedded etcd, with the pod running on, and the others
	// join it.
	// Every server runs a node, and a DaemonSet a pod on each.
	for _, s := range []*testcluster.Node{s1, s2, s3} {
		s.Agent = true
		s.AddImage(image)
	}
	s1.Start("--agent-token", haAgentToken)
	s1.WaitReady(startTimeout)
	applyMigratedWorkload(t, s1)
	before, pod, ready := migratedDump(t, s1), migratedPod(t, s1.Client()), readySince(t, s1.Client(), "server-1")
	s1.Stop()
	s1.Start("--cluster-init", "--agent-token", haAgentToken)
	s1.WaitReady(startTimeout)
	if !s1.Logged("Moved the cluster from SQLite to embedded etcd") {
		t.Error("server-1 did not say it moved its cluster to etcd")
	}
	sameDump(t, "SQLite to etcd", before, migratedDump(t, s1))
	notRestarted(t, pod, migratedPod(t, s1.Client()))
	if since := readySince(t, s1.Client(), "server-1"); !since.Equal(ready) {
		t.Errorf("server-1 was not Ready throughout the migration: Ready since %s, before since %s", since, ready)
	}
	secretEncrypted(t, s1)
	tok, err := os.ReadFile(s1.TokenFile())
	if err != nil {
		t.Fatal(err)
	}
	joinArgs := []string{"--server", s1.URL(), "--token", strings.TrimSpace(string(tok))}

	// No token that joins agents only joins a server: the server's secret
	// as a node's, the agent token, one of `kelp token create`.
	refused := lab.NewNode("server-x", "10.99.0.9")
	if out, err := refused.RunKelp(time.Minute, refused.ServerArgs("--server", s1.URL(), "--token", "node:"+secretOf(string(tok)))...); err == nil || !strings.Contains(out, "only the server token") {
		t.Errorf("a server joining with the server secret as a node token: %v\n%s", err, tail(out))
	}
	agentToken, err := os.ReadFile(layout.Server(s1.DataDir).AgentToken)
	if err != nil {
		t.Fatal(err)
	}
	created, err := s1.RunKelp(time.Minute, "token", "create", "--data-dir", s1.DataDir, "--ttl", "1h")
	if err != nil {
		t.Fatalf("kelp token create: %v\n%s", err, created)
	}
	for _, offered := range []struct{ what, token string }{
		{"an agent token", string(agentToken)},
		{"a token of `kelp token create`", created},
	} {
		tok := strings.TrimSpace(offered.token)
		out, err := refused.RunKelp(time.Minute, refused.ServerArgs("--server", s1.URL(), "--token", tok)...)
		if testcluster.ExitCode(err) != 1 || !strings.Contains(out, "--token is "+offered.what+", which joins agents only: a server joins with the server token, from <data-dir>/server/token") {
			t.Errorf("a server joining with %s: exit %d\n%s", offered.what, testcluster.ExitCode(err), tail(out))
		}
		// Its short form is sent as the server's and refused there.
		_, secret, _ := strings.Cut(tok, "::node:")
		out, err = refused.RunKelp(time.Minute, refused.ServerArgs("--server", s1.URL(), "--token", secret)...)
		if testcluster.ExitCode(err) != 1 || !strings.Contains(out, "only the server token (<data-dir>/server/token on a server) joins servers") {
			t.Errorf("a server joining with the secret of %s: exit %d\n%s", offered.what, testcluster.ExitCode(err), tail(out))
		}
	}

	// Nor does a server with a running server's hostname: the two would
	// take each other's leader leases.
	if out, err := refused.Run(time.Minute, refused.Command("sh", "-c", "echo server-1 > /proc/sys/kernel/hostname")); err != nil {
		t.Fatalf("rename server-x: %v\n%s", err, out)
	}
	if out, err := refused.RunKelp(time.Minute, refused.ServerArgs(joinArgs...)...); err == nil || !strings.Contains(out, `hostname taken: a server with the hostname "server-1" runs already`) {
		t.Errorf("a server joining with server-1's hostname: %v\n%s", err, tail(out))
	}

	// The two join at once: etcd takes one learner at a time, so one waits.
	var wg sync.WaitGroup
	for _, s := range []*testcluster.Node{s2, s3} {
		s.Start(joinArgs...)
		wg.Add(1)
		go func() { defer wg.Done(); s.WaitReady(2 * startTimeout) }()
	}
	wg.Wait()
	agent.StartAgent(s1.URL(), s1.TokenFile())
	agent.WaitLog("kelp node is running", startTimeout)
	c := s2.Client()
	waitNodesReady(t, c, 4)
	testcluster.Eventually(t, "three apiservers in the kubernetes EndpointSlice", func() (bool, error) {
		return len(apiserverAddresses(c)) == 3, nil
	})
	testcluster.Eventually(t, "three voting etcd members", func() (bool, error) {
		promoted := 0
		for _, s := range []*testcluster.Node{s1, s2, s3} {
			promoted += strings.Count(s.Log(), "Promoted etcd learner to voting member")
		}
		return promoted >= 2, nil
	})

	waitServiceAccount(t, c, "default")
	apply(t, s2, haWorkload+"---\n"+haDaemonSet)
	rolloutStatus(t, s2, "daemonset/everywhere", 2*startTimeout)
	testcluster.Eventually(t, "the web pod on the agent ready", func() (bool, error) {
		pod, err := c.CoreV1().Pods("default").Get(context.Background(), "web", metav1.GetOptions{})
		return err == nil && podReady(pod), nil
	})
	serviceIP := webServiceIP(t, c)
	reachable := func(when string) {
		t.Helper()
		testcluster.Eventually(t, "the web Service from the agent "+when, func() (bool, error) {
			return get(agent, "http://"+serviceIP+"/healthz") == nil, nil
		})
	}
	reachable("with three servers")

	// Each server away in turn: writes go on through the others, and the
	// server catches up when it is back.
	servers := []*testcluster.Node{s1, s2, s3}
	for i, away := range servers {
		other := servers[(i+1)%3]
		away.Stop()
		name := fmt.Sprintf("while-%s-away", away.Name)
		must(t, "write with "+away.Name+" away", func() error { return writeConfigMap(other.Client(), name) })
		reachable("with " + away.Name + " away")
		if away == s1 {
			away.Start("--cluster-init")
		} else {
			away.Start(joinArgs...)
		}
		away.WaitReady(startTimeout)
		testcluster.Eventually(t, away.Name+" catching up", func() (bool, error) {
			_, err := away.Client().CoreV1().ConfigMaps("default").Get(context.Background(), name, metav1.GetOptions{})
			return err == nil, nil
		})
	}

	// Two of three SIGKILLed is a lost majority: --cluster-reset on the
	// survivor brings the cluster back, its pod running on, and the two
	// others join it again once their etcd data is moved away, as the
	// README says.
	survivor := everywherePod(t, c, "server-2")
	s1.Kill()
	s3.Kill()
	killed := time.Now()
	_ = s2.StopFailed()
	out, err := s2.RunKelp(2*time.Minute, s2.ServerArgs(append(joinArgs, "--cluster-reset")...)...)
	if err != nil || !strings.Contains(out, "cluster of one member") {
		t.Fatalf("kelp server --cluster-reset after two kills: %v\n%s", err, tail(out))
	}
	s2.Start(joinArgs...)
	s2.WaitReady(startTimeout)
	notRestarted(t, survivor, everywherePod(t, s2.Client(), "server-2"))
	rejoin := []string{"--server", s2.URL(), "--token", strings.TrimSpace(string(tok))}
	// A server's hostname stays its own for 30 s after its last renewal.
	time.Sleep(time.Until(killed.Add(35 * time.Second)))
	for _, s := range []*testcluster.Node{s1, s3} {
		etcd := filepath.Join(s.DataDir, "server", "db", "etcd")
		if err := os.Rename(etcd, etcd+".lost"); err != nil {
			t.Fatal(err)
		}
		s.Start(rejoin...)
	}
	s1.WaitReady(2 * startTimeout)
	s3.WaitReady(2 * startTimeout)
	testcluster.Eventually(t, "three voting etcd members again", func() (bool, error) {
		out, err := s2.RunKelp(time.Minute, "etcdctl", "--data-dir", s2.DataDir, "member", "list")
		return err == nil && strings.Count(out, ", started, ") == 3 && !strings.Contains(out, "true"), nil
	})
	must(t, "write after the rejoin", func() error { return writeConfigMap(s1.Client(), "after-rejoin") })
	reachable("after two servers were killed and rejoined")

	// server-1, which the agent joined through, goes away for good.
	s1.Stop()
	kubectl(t, s2, "delete", "node", "server-1")
	testcluster.Eventually(t, "server-1's etcd member removed", func() (bool, error) {
		return s2.Logged("removed its etcd member") || s3.Logged("removed its etcd member"), nil
	})
	gone := time.Now()
	testcluster.Eventually(t, "the agent's lease renewed through the other servers", func() (bool, error) {
		lease, err := c.CoordinationV1().Leases("kube-node-lease").Get(context.Background(), "agent-1", metav1.GetOptions{})
		return err == nil && renewedAfter(lease, gone.Add(15*time.Second)), nil
	})
	reachable("with server-1 gone")
	out, err = s1.RunKelp(2*time.Minute, s1.ServerArgs(rejoin...)...)
	if err == nil || !strings.Contains(out, "removed from the etcd cluster") {
		t.Errorf("server-1 restarted after its removal: %v, want it to say it was removed\n%s", err, tail(out))
	}

	// Two of the remaining two gone is a lost majority; --cluster-reset on
	// the survivor brings the cluster back with its data.
	s3.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = s2.Client().CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "no-quorum"}}, metav1.CreateOptions{})
	cancel()
	if err == nil {
		t.Error("a write succeeded with one of two etcd members")
	}
	// Without quorum the server may have exited on its own: its
	// controller-manager or scheduler lost its leader election.
	_ = s2.StopFailed()
	out, err = s2.RunKelp(2*time.Minute, s2.ServerArgs(append(joinArgs, "--cluster-reset")...)...)
	if err != nil || !strings.Contains(out, "cluster of one member") {
		t.Fatalf("kelp server --cluster-reset: %v\n%s", err, tail(out))
	}
	s2.Start(joinArgs...)
	s2.WaitReady(startTimeout)
	for _, s := range servers {
		name := fmt.Sprintf("while-%s-away", s.Name)
		if _, err := s2.Client().CoreV1().ConfigMaps("default").Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			t.Errorf("after the reset, %s: %v", name, err)
		}
	}
	must(t, "write after the reset", func() error { return writeConfigMap(s2.Client(), "after-reset") })
	reachable("with server-2 alone")

	// Back to one small server: the survivor moves the cluster to SQLite.
	before = migratedDump(t, s2)
	s2.Stop()
	out, err = s2.RunKelp(2*time.Minute, append([]string{"datastore", "migrate", "--to", "sqlite"}, s2.ServerArgs(joinArgs...)[1:]...)...)
	if err != nil || !strings.Contains(out, "start kelp server without --cluster-init, --server") || !strings.Contains(out, "etcd.before-migrate-") {
		t.Fatalf("kelp datastore migrate --to sqlite: %v\n%s", err, tail(out))
	}
	s2.Start()
	s2.WaitReady(startTimeout)
	sameDump(t, "etcd to SQLite", before, migratedDump(t, s2))
	secretEncrypted(t, s2)
	must(t, "write on SQLite", func() error { return writeConfigMap(s2.Client(), "on-sqlite") })
	reachable("with server-2 on SQLite")
}

func secretOf(tok string) string {
	_, secret, _ := strings.Cut(strings.TrimSpace(tok), "::server:")
	return secret
}

func apiserverAddresses(c kubernetes.Interface) []string {
	slices, err := c.DiscoveryV1().EndpointSlices("default").List(context.Background(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			out = append(out, e.Addresses...)
		}
	}
	return out
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func webServiceIP(t *testing.T, c kubernetes.Interface) string {
	t.Helper()
	svc, err := c.CoreV1().Services("default").Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

func get(n *testcluster.Node, url string) error {
	client := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: n.DialContext, DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

func writeConfigMap(c kubernetes.Interface, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"written": time.Now().String()}}, metav1.CreateOptions{})
	return err
}

func renewedAfter(l *coordinationv1.Lease, t time.Time) bool {
	return l.Spec.RenewTime != nil && l.Spec.RenewTime.After(t)
}

// tail is the end of a long log, enough to see why.
func tail(out string) string {
	if len(out) > 4000 {
		return "…" + out[len(out)-4000:]
	}
	return out
}
