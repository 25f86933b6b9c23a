package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// echoWorkload is what TestNetwork's Services lead to: three replicas
// that answer with their name and the caller's address, behind a plain,
// a sticky, a headless and an externalTrafficPolicy Local Service.
var echoWorkload = testcluster.App{Name: "echo", Replicas: 3, Ready: true}.YAML() + `---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: echo-sticky}
spec:
  selector: {app: echo}
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: echo-headless}
spec:
  clusterIP: None
  selector: {app: echo}
  ports: [{port: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: echo-local}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: echo}
  ports: [{port: 80, targetPort: 8080, nodePort: 30090}]
---
` + testcluster.App{Kind: "Pod", Name: "client"}.YAML()

// TestNetwork runs a server with its node and checks what Services, DNS
// and NetworkPolicy give pods beyond TestNode's basics: spreading over
// every endpoint reached by DNS name, session affinity, a scaled-down
// endpoint left alone, externalTrafficPolicy Local with its health check
// port, headless Services and pod records in DNS, and a NetworkPolicy
// truth table checked by real connections.
func TestNetwork(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.Agent = true
	n.AddImage(testcluster.BuildTestImage(t, testcluster.TestImage))
	outside := n.NewOutside()
	n.Start()
	n.WaitReady(startTimeout)
	n.WaitLog("kelp node is running", startTimeout)
	c := n.Client()
	waitNodeReady(t, c)
	waitServiceAccount(t, c, "default")
	apply(t, n, echoWorkload)
	kubectl(t, n, "wait", "--for=condition=Available", "deployment/echo", "--timeout=120s")
	kubectl(t, n, "wait", "--for=condition=Ready", "pod/client", "--timeout=60s")
	fromClient := func(args ...string) (string, error) {
		out, err := n.Kubectl(append([]string{"exec", "client", "--", "/testapp"}, args...)...)
		return strings.TrimSpace(out), err
	}
	answeredBy := func(url string) string {
		out, err := fromClient("get", url)
		if err != nil {
			return ""
		}
		return strings.Fields(out)[0]
	}

	t.Run("spread over every endpoint by DNS name", func(t *testing.T) {
		seen := map[string]bool{}
		for i := 0; i < 60 && len(seen) < 3; i++ {
			if host := answeredBy("http://echo.default.svc.cluster.local/"); host != "" {
				seen[host] = true
			}
		}
		if len(seen) != 3 {
			t.Errorf("answered by %v in 60 requests, want all 3 replicas", seen)
		}
	})
	t.Run("client IP affinity", func(t *testing.T) {
		// On a busy machine a kubectl exec fails now and then; only the
		// answers count.
		first := ""
		for i := 0; i < 10 && first == ""; i++ {
			first = answeredBy("http://echo-sticky/")
		}
		if first == "" {
			t.Fatal("echo-sticky did not answer")
		}
		for range 10 {
			if host := answeredBy("http://echo-sticky/"); host != "" && host != first {
				t.Fatalf("answered by %s after %s: the client did not stick", host, first)
			}
		}
	})
	t.Run("external traffic policy Local", func(t *testing.T) {
		client := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: outside.DialContext, DisableKeepAlives: true}}
		var body string
		testcluster.Eventually(t, "the Local NodePort answers from outside", func() (bool, error) {
			resp, err := client.Get("http://" + testcluster.NodeOutsideIP + ":30090/")
			if err != nil {
				return false, nil
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
			return strings.HasPrefix(body, "echo-"), nil
		})
		if f := strings.Fields(body); len(f) != 2 || !strings.HasPrefix(f[1], testcluster.OutsideIP+":") {
			t.Errorf("the endpoint saw the caller as %q, want the client's own address %s", body, testcluster.OutsideIP)
		}
		svc, err := c.CoreV1().Services("default").Get(context.Background(), "echo-local", metav1.GetOptions{})
		if err != nil || svc.Spec.HealthCheckNodePort == 0 {
			t.Fatalf("echo-local has no health check port: %v", err)
		}
		health := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: n.DialContext, DisableKeepAlives: true}}
		testcluster.Eventually(t, "the health check port counts 3 local endpoints", func() (bool, error) {
			resp, err := health.Get(fmt.Sprintf("http://%s:%d/", testcluster.NodeIP, svc.Spec.HealthCheckNodePort))
			if err != nil {
				return false, nil
			}
			defer resp.Body.Close()
			var status struct{ LocalEndpoints int }
			err = json.NewDecoder(resp.Body).Decode(&status)
			return err == nil && resp.StatusCode == http.StatusOK && status.LocalEndpoints == 3, nil
		})
	})
	t.Run("headless Service and pod records", func(t *testing.T) {
		pods, err := c.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=echo"})
		if err != nil {
			t.Fatal(err)
		}
		testcluster.Eventually(t, "the headless name answers every pod IP", func() (bool, error) {
			out, _ := fromClient("lookup", "echo-headless.default.svc.cluster.local")
			for _, p := range pods.Items {
				if !strings.Contains(out, p.Status.PodIP) {
					return false, nil
				}
			}
			return true, nil
		})
		ip := pods.Items[0].Status.PodIP
		if out, err := fromClient("lookup", strings.ReplaceAll(ip, ".", "-")+".default.pod.cluster.local"); err != nil || out != ip {
			t.Errorf("pod record of %s: %q %v", ip, out, err)
		}
	})
	t.Run("a scaled-down endpoint gets no more traffic", func(t *testing.T) {
		kubectl(t, n, "scale", "deployment/echo", "--replicas=2")
		var left map[string]bool
		testcluster.Eventually(t, "two echo pods left", func() (bool, error) {
			pods, err := c.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=echo"})
			if err != nil {
				return false, err
			}
			left = map[string]bool{}
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil {
					left[p.Name] = true
				}
			}
			return len(left) == 2 && len(pods.Items) == 2, nil
		})
		svc, err := c.CoreV1().Services("default").Get(context.Background(), "echo", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// By the Service's address, so a slow DNS answer on a busy machine
		// is not mistaken for traffic sent to a pod that is gone. An exec
		// that fails before the request runs is tried again; a request
		// that fails inside the pod is the failure this looks for.
		url := "http://" + svc.Spec.ClusterIP + "/"
		for answers, tries := 0, 0; answers < 20; tries++ {
			out, err := fromClient("get", url)
			if err != nil && !strings.Contains(out, "command terminated with exit code") && tries < 40 {
				continue
			}
			if f := strings.Fields(out); err != nil || len(f) == 0 || !left[f[0]] {
				t.Fatalf("answer %q (%v), not one of the pods left %v", out, err, left)
			}
			answers++
		}
	})
	t.Run("network policy", func(t *testing.T) {
		networkPolicyTable(t, n)
	})
	// CoreDNS's kubernetes plugin takes klog over when it loads; kelp
	// takes it back, so the kubelet's lines keep their own component.
	if n.Logged("plugin/kubernetes: Observed pod startup duration") {
		t.Error("the kubelet logs through CoreDNS's logger")
	}
}

// apply writes manifest to a file and applies it.
func apply(t *testing.T, n *testcluster.Node, manifest string) {
	t.Helper()
	f, err := os.CreateTemp(n.Dir, "manifest-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(manifest); err != nil {
		t.Fatal(err)
	}
	f.Close()
	kubectl(t, n, "apply", "-f", f.Name())
}

// rolloutStatus waits up to timeout for what (e.g. daemonset/web) to be
// rolled out: all its pods Ready.
func rolloutStatus(t *testing.T, n *testcluster.Node, what string, timeout time.Duration) {
	t.Helper()
	if out, err := n.RunKelp(timeout+10*time.Second, "kubectl", "--kubeconfig", n.Kubeconfig, "rollout", "status", what, "--timeout="+timeout.String()); err != nil {
		t.Fatalf("%s was not rolled out: %v\n%s", what, err, out)
	}
}

// policyNamespaces are the namespaces of the NetworkPolicy test.
const policyNamespaces = `
apiVersion: v1
kind: Namespace
metadata: {name: np-a, labels: {team: a}}
---
apiVersion: v1
kind: Namespace
metadata: {name: np-b, labels: {team: b}}
`

// policyPods are the pods of the NetworkPolicy test, in two namespaces:
// each serves HTTP on its "http" port 8080 and its "metrics" port 8081.
func policyPods() string {
	var b strings.Builder
	for i, p := range []struct{ ns, name, labels string }{
		{"np-a", "server", "{app: server}"},
		{"np-a", "client", "{app: client, role: frontend}"},
		{"np-a", "other", "{app: other}"},
		{"np-b", "server", "{app: server}"},
		{"np-b", "client", "{app: client}"},
	} {
		if i > 0 {
			b.WriteString("---\n")
		}
		fmt.Fprintf(&b, `apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: %s}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: http
    image: %s
    imagePullPolicy: IfNotPresent
    args: [serve]
    ports: [{containerPort: 8080, name: http}]
    readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
  - name: metrics
    image: %s
    imagePullPolicy: IfNotPresent
    args: [serve, -listen, ":8081"]
    ports: [{containerPort: 8081, name: metrics}]
`, p.name, p.ns, p.labels, testcluster.TestImage, testcluster.TestImage)
	}
	return b.String()
}

// policies isolate np-a for ingress and np-b/client for egress.
// blockedIP is excepted from np-b/client's ipBlock.
func policies(blockedIP string) string {
	return `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: np-a}
spec:
  podSelector: {}
  policyTypes: [Ingress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: frontend-http, namespace: np-a}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: frontend}}}]
    ports: [{port: http}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: team-b-metrics, namespace: np-a}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: b}}, podSelector: {matchLabels: {app: client}}}]
    ports: [{protocol: TCP, port: 8000, endPort: 8090}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-egress, namespace: np-b}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.42.0.0/16, except: [` + blockedIP + `/32]}}]
  - to: [{namespaceSelector: {matchLabels: {team: a}}, podSelector: {matchLabels: {app: server}}}]
    ports: [{port: metrics}]
`
}

// networkPolicyTable applies policies and checks who reaches whom.
func networkPolicyTable(t *testing.T, n *testcluster.Node) {
	c := n.Client()
	apply(t, n, policyNamespaces)
	for _, ns := range []string{"np-a", "np-b"} {
		waitServiceAccount(t, c, ns)
	}
	apply(t, n, policyPods())
	for _, ns := range []string{"np-a", "np-b"} {
		kubectl(t, n, "wait", "-n", ns, "--for=condition=Ready", "pod", "--all", "--timeout=90s")
	}
	ips := map[string]string{}
	for _, ns := range []string{"np-a", "np-b"} {
		pods, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			ips[ns+"/"+p.Name] = p.Status.PodIP
		}
	}
	type pair struct {
		from, to string
		port     int
	}
	reaches := func(p pair) bool {
		ns, name, _ := strings.Cut(p.from, "/")
		out, err := n.Kubectl("exec", "-n", ns, name, "-c", "http", "--", "/testapp", "get", fmt.Sprintf("http://%s:%d/", ips[p.to], p.port), "3s")
		return err == nil && strings.Contains(out, strings.Split(p.to, "/")[1])
	}
	// check tries every pair until each has once behaved as want says, or
	// a deadline passes: policies take effect within about a second, and
	// on a busy machine a single try can time out.
	check := func(want map[pair]bool) {
		t.Helper()
		pending := maps.Clone(want)
		deadline := time.Now().Add(time.Minute)
		for {
			var mu sync.Mutex
			var wg sync.WaitGroup
			slots := make(chan struct{}, 4) // kubectl execs at a time
			for p, allowed := range maps.Clone(pending) {
				wg.Go(func() {
					slots <- struct{}{}
					defer func() { <-slots }()
					if reaches(p) == allowed {
						mu.Lock()
						delete(pending, p)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(pending) == 0 {
				return
			}
			if time.Now().After(deadline) {
				var wrong []string
				for p, allowed := range pending {
					wrong = append(wrong, fmt.Sprintf("%s → %s:%d allowed=%v, want %v", p.from, p.to, p.port, !allowed, allowed))
				}
				t.Fatalf("network policy not enforced as written:\n%s", strings.Join(wrong, "\n"))
			}
			time.Sleep(time.Second)
		}
	}
	everyone := map[pair]bool{}
	for from := range ips {
		for to := range ips {
			if from != to {
				everyone[pair{from, to, 8080}] = true
			}
		}
	}
	check(everyone) // no policy: all allowed

	apply(t, n, policies(ips["np-a/server"]))
	check(map[pair]bool{
		{"np-a/client", "np-a/server", 8080}: true,  // frontend, named port http
		{"np-a/client", "np-a/server", 8081}: false, // metrics only for team b
		{"np-a/other", "np-a/server", 8080}:  false, // not a frontend
		{"np-a/other", "np-a/client", 8080}:  false, // default deny
		{"np-b/client", "np-a/server", 8081}: true,  // namespace and pod selector, port range; egress by named port
		{"np-b/client", "np-a/server", 8080}: false, // egress: the ipBlock excepts it
		{"np-b/client", "np-b/server", 8080}: true,  // egress: inside the ipBlock
		{"np-b/server", "np-a/server", 8081}: false, // team b, but not a client
		{"np-a/client", "np-b/server", 8080}: true,  // no policy selects either side
		{"np-b/client", "np-a/other", 8080}:  false, // np-a isolates every pod
	})

	kubectl(t, n, "delete", "-n", "np-a", "networkpolicy", "frontend-http")
	check(map[pair]bool{{"np-a/client", "np-a/server", 8080}: false})
	kubectl(t, n, "delete", "-n", "np-a", "networkpolicy", "default-deny", "team-b-metrics")
	check(map[pair]bool{{"np-a/other", "np-a/server", 8080}: true, {"np-a/other", "np-a/client", 8080}: true})
}
