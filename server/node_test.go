package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// workload is what TestNode runs: a Deployment of the test image with
// probes and every common volume kind, a Job, and a pod whose image
// exists nowhere.
const workload = `
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {greeting: hello from a configmap}
---
apiVersion: v1
kind: Secret
metadata: {name: credentials}
stringData: {password: s3cret}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: ` + testcluster.TestImage + `
        imagePullPolicy: IfNotPresent
        args: [serve]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
        livenessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 5}
        volumeMounts:
        - {name: cache, mountPath: /cache}
        - {name: settings, mountPath: /config}
        - {name: credentials, mountPath: /secret}
        - {name: token, mountPath: /token}
      volumes:
      - {name: cache, emptyDir: {}}
      - {name: settings, configMap: {name: settings}}
      - {name: credentials, secret: {secretName: credentials}}
      - name: token
        projected:
          sources:
          - serviceAccountToken: {path: token, expirationSeconds: 3600, audience: test}
---
apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - {name: once, image: ` + testcluster.TestImage + `, imagePullPolicy: IfNotPresent, args: [exit, "0"]}
---
apiVersion: v1
kind: Pod
metadata: {name: missing-image}
spec:
  containers:
  - {name: missing, image: "docker.io/kelp-test/does-not-exist:1.0"}
`

// udpWorkload is a UDP server behind a Service.
var udpWorkload = testcluster.App{Name: "udp", Args: []string{"udpserve"}}.YAML() + `---
apiVersion: v1
kind: Service
metadata: {name: udp}
spec:
  selector: {app: udp}
  ports: [{port: 53, targetPort: 5353, protocol: UDP}]
`

const hostPortWorkload = `
apiVersion: v1
kind: Pod
metadata: {name: hostport}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: web
    image: ` + testcluster.TestImage + `
    imagePullPolicy: IfNotPresent
    args: [serve]
    ports: [{containerPort: 8080, hostPort: 8081}]
`

// staticPod is run by the kubelet from a file, without the apiserver.
var staticPod = testcluster.App{Kind: "Pod", Name: "static-web"}.YAML()

// testRegistry is the registry TestNodeImages's node pulls from, through a
// mirror the test serves.
const testRegistry = "registry.kelp.test"

// TestNodeWorkloads runs `kelp server` with its node and checks what pods
// get: pods from an airgap image, kubectl logs, exec and port-forward,
// volumes, a Job, pod-to-pod and masqueraded egress traffic, Services of
// every type, a UDP Service and DNS.
func TestNodeWorkloads(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.AddImage(testcluster.BuildTestImage(t, testcluster.TestImage))
	outside := n.NewOutside()
	c, pods := startWebNode(t, n)
	t.Run("logs", func(t *testing.T) {
		if out := kubectl(t, n, "logs", pods[0].Name); !strings.Contains(out, "serving on :8080") {
			t.Errorf("logs: %q", out)
		}
	})
	t.Run("exec and volumes", func(t *testing.T) {
		for file, want := range map[string]string{
			"/config/greeting": "hello from a configmap",
			"/secret/password": "s3cret",
			"/proc/mounts":     " /cache ",
			"/token/token":     "eyJ", // a JWT
		} {
			if out := kubectl(t, n, "exec", pods[0].Name, "--", "/testapp", "cat", file); !strings.Contains(out, want) {
				t.Errorf("%s holds %q, want %q in it", file, out, want)
			}
		}
	})
	t.Run("port-forward", func(t *testing.T) {
		portForward(t, n, pods[0].Name)
	})
	t.Run("pod to pod", func(t *testing.T) {
		out := kubectl(t, n, "exec", pods[0].Name, "--", "/testapp", "get", "http://"+net.JoinHostPort(pods[1].Status.PodIP, "8080")+"/")
		if !strings.HasPrefix(out, pods[1].Name+" "+pods[0].Status.PodIP+":") {
			t.Errorf("pod %s answered %q, want its name and the caller's pod IP", pods[1].Name, out)
		}
	})
	t.Run("egress is masqueraded", func(t *testing.T) {
		l, err := outside.Listen("tcp", net.JoinHostPort(testcluster.OutsideIP, "9090"))
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, r.RemoteAddr) })}
		go srv.Serve(l)
		defer srv.Close()
		out := kubectl(t, n, "exec", pods[0].Name, "--", "/testapp", "get", "http://"+testcluster.OutsideIP+":9090/")
		if host, _, _ := net.SplitHostPort(out); host == pods[0].Status.PodIP || host == "" {
			t.Errorf("outside saw %q: want the node's address, not the pod's", out)
		}
	})
	t.Run("services", func(t *testing.T) {
		svc, err := c.CoreV1().Services("default").Create(context.Background(), &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec: corev1.ServiceSpec{
				Type:     corev1.ServiceTypeNodePort,
				Selector: map[string]string{"app": "web"},
				Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30080}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Through the ClusterIP, from a pod, until both replicas answered.
		seen := map[string]bool{}
		testcluster.Eventually(t, "both web pods answer through the ClusterIP", func() (bool, error) {
			out, err := n.Kubectl("exec", pods[0].Name, "--", "/testapp", "get", "http://"+svc.Spec.ClusterIP+"/")
			if err == nil {
				seen[strings.Fields(out)[0]] = true
			}
			return len(seen) == 2, nil
		})
		// A LoadBalancer gets the node's address, and answers on it; an
		// external IP answers from outside.
		lb, err := c.CoreV1().Services("default").Create(context.Background(), &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web-lb"},
			Spec: corev1.ServiceSpec{
				Type:        corev1.ServiceTypeLoadBalancer,
				Selector:    map[string]string{"app": "web"},
				ExternalIPs: []string{testcluster.NodeOutsideIP},
				Ports:       []corev1.ServicePort{{Port: 8088, TargetPort: intstr.FromInt32(8080)}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		testcluster.Eventually(t, "the LoadBalancer Service gets the node's address", func() (bool, error) {
			lb, err = c.CoreV1().Services("default").Get(context.Background(), lb.Name, metav1.GetOptions{})
			return err == nil && len(lb.Status.LoadBalancer.Ingress) == 1 && lb.Status.LoadBalancer.Ingress[0].IP == testcluster.NodeIP, err
		})
		for addr, dial := range map[string]func(context.Context, string, string) (net.Conn, error){
			testcluster.NodeIP + ":8088":        n.DialContext,
			testcluster.NodeOutsideIP + ":8088": outside.DialContext,
		} {
			client := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
			testcluster.Eventually(t, "web answers on "+addr, func() (bool, error) {
				resp, err := client.Get("http://" + addr + "/")
				if err != nil {
					return false, nil
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				return strings.HasPrefix(string(body), "web-"), nil
			})
		}
		// A pod's hostPort answers on the node's addresses. Pod
		// Security's default, baseline, refuses it in a namespace without
		// a level of its own; one labelled privileged runs it.
		hostPortPod := filepath.Join(n.Dir, "hostport.yaml")
		if err := os.WriteFile(hostPortPod, []byte(hostPortWorkload), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := n.Kubectl("apply", "-f", hostPortPod); err == nil || !strings.Contains(out, `violates PodSecurity "baseline:latest"`) {
			t.Errorf("a hostPort pod in default: %v\n%s\nwant it refused by Pod Security baseline", err, out)
		}
		kubectl(t, n, "create", "namespace", "host")
		kubectl(t, n, "label", "namespace", "host", "pod-security.kubernetes.io/enforce=privileged")
		waitServiceAccount(t, c, "host")
		kubectl(t, n, "apply", "-n", "host", "-f", hostPortPod)
		kubectl(t, n, "wait", "-n", "host", "--for=condition=Ready", "pod/hostport", "--timeout=60s")
		client := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: outside.DialContext, DisableKeepAlives: true}}
		testcluster.Eventually(t, "the hostPort answers from outside", func() (bool, error) {
			resp, err := client.Get("http://" + testcluster.NodeOutsideIP + ":8081/")
			if err != nil {
				return false, nil
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return strings.HasPrefix(string(body), "hostport "), nil
		})
		// A Service without endpoints refuses at once.
		empty, err := c.CoreV1().Services("default").Create(context.Background(), &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "empty"},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": "nothing"},
				Ports:    []corev1.ServicePort{{Port: 80}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		testcluster.Eventually(t, "a connection to a Service without endpoints refused", func() (bool, error) {
			out, _ := n.Kubectl("exec", pods[0].Name, "--", "/testapp", "get", "http://"+empty.Spec.ClusterIP+"/")
			return strings.Contains(out, "connection refused"), nil
		})
		// The kubernetes Service leads to the apiserver.
		if out := kubectl(t, n, "exec", pods[0].Name, "--", "/testapp", "get", "http://10.43.0.1:443/"); !strings.Contains(out, "HTTP request to an HTTPS server") {
			t.Errorf("kubernetes Service answered %q", out)
		}
		// The NodePort, from the node itself and from outside it.
		for name, dial := range map[string]func(context.Context, string, string) (net.Conn, error){
			testcluster.NodeIP:        n.DialContext,
			testcluster.NodeOutsideIP: outside.DialContext,
		} {
			client := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
			resp, err := client.Get("http://" + name + ":30080/")
			if err != nil {
				t.Errorf("NodePort on %s: %v", name, err)
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.HasPrefix(string(body), "web-") {
				t.Errorf("NodePort on %s answered %q", name, body)
			}
		}
	})
	t.Run("udp service follows a replaced endpoint", func(t *testing.T) {
		apply(t, n, udpWorkload)
		kubectl(t, n, "wait", "--for=condition=Available", "deployment/udp", "--timeout=60s")
		svc, err := c.CoreV1().Services("default").Get(context.Background(), "udp", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ask := func() string {
			out, _ := n.Kubectl("exec", pods[0].Name, "--", "/testapp", "udpget", svc.Spec.ClusterIP+":53")
			return strings.TrimSpace(out)
		}
		var first string
		testcluster.Eventually(t, "the UDP Service answers", func() (bool, error) {
			first = ask()
			return strings.HasPrefix(first, "udp-"), nil
		})
		kubectl(t, n, "delete", "pod", first, "--wait=false")
		// The client keeps its source port, so only a forgotten conntrack
		// entry lets its datagrams reach the new pod.
		testcluster.Eventually(t, "the replacement pod answers the same flow", func() (bool, error) {
			out := ask()
			return strings.HasPrefix(out, "udp-") && out != first, nil
		})
	})
	t.Run("dns", func(t *testing.T) {
		svc, err := c.CoreV1().Services("default").Get(context.Background(), "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().Services("default").Create(context.Background(), &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "ext"},
			Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		kubeDNS, err := c.CoreV1().Services("kube-system").Get(context.Background(), "kube-dns", metav1.GetOptions{})
		if err != nil || kubeDNS.Spec.ClusterIP != "10.43.0.10" {
			t.Errorf("kube-dns Service: %v %v", kubeDNS.Spec.ClusterIP, err)
		}
		exec := func(args ...string) string {
			out, _ := n.Kubectl(append([]string{"exec", pods[0].Name, "--", "/testapp"}, args...)...)
			return strings.TrimSpace(out)
		}
		for _, q := range []struct {
			args []string
			want string
		}{
			{[]string{"lookup", "web"}, svc.Spec.ClusterIP}, // through the search path
			{[]string{"lookup", "web.default.svc.cluster.local"}, svc.Spec.ClusterIP},
			{[]string{"srv", "http", "tcp", "web.default.svc.cluster.local"}, "web.default.svc.cluster.local. 80"},
			{[]string{"ptr", svc.Spec.ClusterIP}, "web.default.svc.cluster.local."},
			{[]string{"cname", "ext.default.svc.cluster.local"}, "example.com."},
			{[]string{"get", "http://web.default.svc.cluster.local/"}, "web-"},
		} {
			testcluster.Eventually(t, fmt.Sprintf("%v answers %q", q.args, q.want), func() (bool, error) {
				return strings.Contains(exec(q.args...), q.want), nil
			})
		}
		// Customised without a restart: hosts entries and a server block.
		if _, err := c.CoreV1().ConfigMaps("kube-system").Create(context.Background(), &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "coredns-custom"},
			Data: map[string]string{
				"hosts":       "10.1.2.3 legacy.example",
				"corp.server": "corp.example:53 {\n    bind 10.43.0.10\n    hosts {\n        10.7.7.7 app.corp.example\n    }\n}\n",
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, q := range []struct {
			args []string
			want string
		}{
			{[]string{"lookup", "legacy.example"}, "10.1.2.3"},
			{[]string{"lookup", "app.corp.example"}, "10.7.7.7"},
			{[]string{"lookup", "web"}, svc.Spec.ClusterIP}, // the cluster's names still answer
		} {
			testcluster.Eventually(t, fmt.Sprintf("%v answers %q", q.args, q.want), func() (bool, error) {
				return strings.Contains(exec(q.args...), q.want), nil
			})
		}
		// The nodes' DNS identity reads that ConfigMap and no other.
		for _, q := range []struct {
			args []string
			want string
		}{
			{[]string{"get", "configmap/coredns-custom"}, "yes"},
			{[]string{"watch", "configmap/coredns-custom"}, "yes"},
			{[]string{"get", "configmap/extension-apiserver-authentication"}, "no"},
			{[]string{"list", "configmaps"}, "no"},
		} {
			out, _ := n.Kubectl(append([]string{"auth", "can-i", "-n", "kube-system", "--as", "system:kelp-dns"}, q.args...)...)
			if strings.TrimSpace(out) != q.want {
				t.Errorf("may system:kelp-dns %v in kube-system? %q, want %s", q.args, out, q.want)
			}
		}
	})
}

// TestNodeImages runs `kelp server` with its node and checks its images
// and runtime tools: a broken airgap tarball reported by name, a missing
// image, an airgap image added while kelp runs, crictl and ctr, and
// crictl pull and rmi through a mirror.
func TestNodeImages(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.AddImage(testcluster.BuildTestImage(t, testcluster.TestImage))
	images := filepath.Join(n.DataDir, "agent", "images")
	if err := os.WriteFile(filepath.Join(images, "broken.tar.gz"), []byte("not a tarball"), 0o600); err != nil {
		t.Fatal(err)
	}
	// crictl pull fetches from a registry the test serves in the node's
	// network namespace, a plain-HTTP mirror of registry.kelp.test.
	registriesFile := filepath.Join(n.Dir, "registries.yaml")
	if err := os.WriteFile(registriesFile, []byte("mirrors:\n  "+testRegistry+":\n    endpoint: [\"http://"+testcluster.NodeIP+":5000\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, pods := startWebNode(t, n, "--private-registry", registriesFile)
	if !n.Logged("airgap image tarball not imported") || !n.Logged(filepath.Join(images, "broken.tar.gz")+": not gzip") {
		t.Error("the broken airgap tarball is not reported by name")
	}

	t.Run("missing image", func(t *testing.T) {
		testcluster.Eventually(t, "an ErrImagePull event for the missing image", func() (bool, error) {
			events, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=missing-image"})
			if err != nil {
				return false, err
			}
			for _, e := range events.Items {
				if e.Reason == "Failed" && strings.Contains(e.Message, "does-not-exist") {
					return true, nil
				}
			}
			return false, nil
		})
		waitNodeReady(t, c)
	})
	t.Run("airgap image added while running", func(t *testing.T) {
		const late = "docker.io/kelp-test/late:1.0"
		copyFile(t, testcluster.BuildTestImage(t, late), filepath.Join(images, "late.tar"))
		testcluster.Eventually(t, "the new tarball imported", func() (bool, error) {
			out, err := n.RunKelp(time.Minute, "ctr", "-n", "k8s.io", "images", "ls", "-q")
			return err == nil && strings.Contains(out, late), nil
		})
	})
	t.Run("crictl and ctr", func(t *testing.T) {
		out, err := n.RunKelp(time.Minute, "crictl", "ps")
		if err != nil || !strings.Contains(out, " web ") {
			t.Errorf("crictl ps: %v\n%s", err, out)
		}
		out, err = n.RunKelp(time.Minute, "crictl", "images")
		if err != nil || !strings.Contains(out, "docker.io/kelp-test/testapp   1.0") || !strings.Contains(out, "true") {
			t.Errorf("crictl images (the airgap image must be pinned): %v\n%s", err, out)
		}
		out, err = n.RunKelp(time.Minute, "ctr", "-n", "k8s.io", "images", "ls", "-q")
		if err != nil || !strings.Contains(out, testcluster.TestImage) {
			t.Errorf("ctr images ls: %v\n%s", err, out)
		}
		crictl := func(args ...string) string {
			t.Helper()
			out, err := n.RunKelp(time.Minute, append([]string{"crictl"}, args...)...)
			if err != nil {
				t.Fatalf("crictl %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			return out
		}
		pod := strings.Fields(crictl("pods", "--name", pods[0].Name, "--namespace", "default", "-q"))[0]
		id := strings.Fields(crictl("ps", "--pod", pod, "--name", "web", "-q"))[0]
		for _, check := range []struct {
			args []string
			want string
		}{
			{[]string{"inspect", id}, `"state": "CONTAINER_RUNNING"`},
			{[]string{"inspectp", pod}, `"state": "SANDBOX_READY"`},
			{[]string{"inspecti", testcluster.TestImage}, `"pinned": true`},
			{[]string{"logs", "--tail", "1", id}, "serving on :8080"},
			{[]string{"exec", "-s", id, "/testapp", "cat", "/config/greeting"}, "hello from a configmap"},
			{[]string{"exec", "-i", id, "/testapp", "cat", "/config/greeting"}, "hello from a configmap"},
			{[]string{"stats"}, " web "},
			{[]string{"info"}, `"type": "RuntimeReady"`},
		} {
			if out := crictl(check.args...); !strings.Contains(out, check.want) {
				t.Errorf("crictl %s: want %q in\n%s", strings.Join(check.args, " "), check.want, out)
			}
		}
		// From outside the node's namespaces (here, the test's), its data
		// dir names it: kelp reaches its /run/kelp and /var/log/pods
		// through its containerd's /proc/PID/root.
		for _, check := range []struct {
			env  []string
			args []string
			want string
		}{
			{nil, []string{"crictl", "--data-dir", n.DataDir, "ps"}, " web "},
			{[]string{"KELP_DATA_DIR=" + n.DataDir}, []string{"crictl", "logs", "--tail", "1", id}, "serving on :8080"},
			{nil, []string{"ctr", "--data-dir=" + n.DataDir, "-n", "k8s.io", "images", "ls", "-q"}, testcluster.TestImage},
		} {
			cmd := exec.Command(testcluster.Binary(t), check.args...)
			cmd.Env = append(os.Environ(), check.env...)
			if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), check.want) {
				t.Errorf("%s kelp %s from outside the node: %v, want %q in\n%s", strings.Join(check.env, " "), strings.Join(check.args, " "), err, check.want, out)
			}
		}
		if out, err := n.RunKelp(time.Minute, "crictl", "inspect", "no-such-container"); err == nil || !strings.Contains(out, "no-such-container") {
			t.Errorf("crictl inspect of a missing container: %v\n%s", err, out)
		}
		if out, err := n.RunKelp(time.Minute, "crictl", "exec", "-s", id, "/testapp", "cat", "/no/such/file"); err == nil || strings.Contains(out, "is kelp running") {
			t.Errorf("crictl exec of a failing command: want its status alone, got %v\n%s", err, out)
		}

		t.Run("logs -f", func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), "follow.log")
			log, err := os.Create(logPath)
			if err != nil {
				t.Fatal(err)
			}
			defer log.Close()
			follow := n.Command(testcluster.Binary(t), "crictl", "logs", "-f", "--tail", "0", id)
			follow.Stdout, follow.Stderr = log, log
			if err := testcluster.Spawn(follow); err != nil {
				t.Fatal(err)
			}
			defer func() {
				_ = follow.Process.Kill()
				_ = follow.Wait()
			}()
			// What the container's main process writes to its stdout
			// goes to its log. Lines written before crictl read to the
			// end are not printed (--tail 0): write until one is, then
			// one more.
			lines := 0
			write := func() string {
				lines++
				line := fmt.Sprintf("followed line %d", lines)
				crictl("exec", "-s", id, "/testapp", "write", "/proc/1/fd/1", line+"\n")
				return line
			}
			printed := func(line string) func() (bool, error) {
				return func() (bool, error) {
					data, err := os.ReadFile(logPath)
					return strings.Contains(string(data), line), err
				}
			}
			testcluster.Eventually(t, "crictl logs -f prints a line written after it started", func() (bool, error) {
				write()
				return printed("followed line")()
			})
			testcluster.Eventually(t, "crictl logs -f prints the next line", printed(write()))
			if data, _ := os.ReadFile(logPath); strings.Contains(string(data), "serving on") {
				t.Errorf("crictl logs -f --tail 0 printed the log from its start:\n%s", data)
			}
		})
		t.Run("exec -t", func(t *testing.T) {
			// The seventh field of /proc/self/stat is the controlling
			// terminal of the command: 0 for none.
			ttyOf := func(stat string) string {
				if fields := strings.Fields(stat[strings.LastIndex(stat, ")")+1:]); len(fields) > 4 {
					return fields[4]
				}
				return ""
			}
			out, err := n.RunKelpInTerminal(time.Minute, "crictl", "exec", "-it", id, "/testapp", "cat", "/proc/self/stat")
			if tty := ttyOf(out); err != nil || tty == "" || tty == "0" {
				t.Errorf("crictl exec -it: the command has no terminal (tty %q): %v\n%s", tty, err, out)
			}
			if out, err := n.RunKelpInTerminal(time.Minute, "crictl", "exec", "-t", id, "/testapp", "cat", "/proc/self/stat"); err == nil || !strings.Contains(out, "so it needs -i too") || strings.Contains(out, "warning") {
				t.Errorf("crictl exec -t without -i: %v\n%s", err, out)
			}
			if tty := ttyOf(crictl("exec", "-s", id, "/testapp", "cat", "/proc/self/stat")); tty != "0" {
				t.Errorf("crictl exec -s: the command has the terminal %q, want none", tty)
			}
		})
		t.Run("stop, rm, stopp and rmp", func(t *testing.T) {
			target := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "crictl-target"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "target", Image: testcluster.TestImage, ImagePullPolicy: corev1.PullIfNotPresent, Args: []string{"serve"},
				}}},
			}
			if _, err := c.CoreV1().Pods("default").Create(context.Background(), target, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			defer func() {
				zero := int64(0)
				_ = c.CoreV1().Pods("default").Delete(context.Background(), target.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			}()
			kubectl(t, n, "wait", "--for=condition=Ready", "pod/"+target.Name, "--timeout=60s")
			pod := strings.Fields(crictl("pods", "--name", target.Name, "--namespace", "default", "-q"))[0]
			ctr := strings.Fields(crictl("ps", "--pod", pod, "-q"))[0]
			// The kubelet starts the pod again, with a new container and
			// sandbox: what was named is gone.
			for _, step := range []struct {
				args []string
				want string
			}{
				{[]string{"stop", ctr}, `"state": "CONTAINER_EXITED"`},
				{[]string{"rm", ctr}, ""},
				{[]string{"stopp", pod}, `"state": "SANDBOX_NOTREADY"`},
				{[]string{"rmp", pod}, ""},
			} {
				if out := crictl(step.args...); !strings.Contains(out, step.args[1]) {
					t.Errorf("crictl %s does not name what it did:\n%s", strings.Join(step.args, " "), out)
				}
				inspect := map[string]string{"stop": "inspect", "rm": "inspect", "stopp": "inspectp", "rmp": "inspectp"}[step.args[0]]
				out, err := n.RunKelp(time.Minute, "crictl", inspect, step.args[1])
				if step.want != "" && (err != nil || !strings.Contains(out, step.want)) {
					t.Errorf("after crictl %s: want %s in crictl %s: %v\n%s", strings.Join(step.args, " "), step.want, inspect, err, out)
				}
				if step.want == "" && (err == nil || !strings.Contains(out, "not found")) {
					t.Errorf("after crictl %s: crictl %s still finds it: %v\n%s", strings.Join(step.args, " "), inspect, err, out)
				}
			}
			if out := crictl("ps", "-a", "-q"); strings.Contains(out, ctr) {
				t.Errorf("crictl ps -a still lists the removed container %s:\n%s", ctr, out)
			}
			if out := crictl("pods", "-q"); strings.Contains(out, pod) {
				t.Errorf("crictl pods still lists the removed pod %s:\n%s", pod, out)
			}
			// containerd removes what it does not know without an error:
			// a mistyped or stale ID must not pass as done.
			for _, args := range [][]string{{"rm", ctr}, {"stop", ctr}, {"rmp", pod}, {"stopp", pod}, {"rmi", testRegistry + "/kelp-test/never-pulled:1.0"}} {
				if out, err := n.RunKelp(time.Minute, append([]string{"crictl"}, args...)...); err == nil || !strings.Contains(out, args[1]+" not found on this node (kelp crictl ") {
					t.Errorf("crictl %s of something gone: %v\n%s", strings.Join(args, " "), err, out)
				}
			}
		})
		t.Run("pull and rmi", func(t *testing.T) {
			l, err := n.Listen("tcp", testcluster.NodeIP+":5000")
			if err != nil {
				t.Fatal(err)
			}
			registry := testcluster.ServeRegistry(t, l)
			if err := registry.Push(testcluster.BuildTestImage(t, testcluster.TestImage), "kelp-test/pulled:1.0"); err != nil {
				t.Fatal(err)
			}
			pulled := testRegistry + "/kelp-test/pulled:1.0"
			if out := crictl("pull", pulled); !strings.Contains(out, "Image is up to date for sha256:") {
				t.Errorf("crictl pull %s:\n%s", pulled, out)
			}
			if out := crictl("images"); !strings.Contains(out, testRegistry+"/kelp-test/pulled   1.0") {
				t.Errorf("crictl images lacks the pulled image:\n%s", out)
			}
			crictl("rmi", pulled)
			if out := crictl("images"); strings.Contains(out, "kelp-test/pulled") || !strings.Contains(out, "docker.io/kelp-test/testapp   1.0") {
				t.Errorf("crictl images after crictl rmi %s: want it gone and the airgap image kept:\n%s", pulled, out)
			}
		})
	})
}

// TestNodeLifecycle runs `kelp server` with its node and checks the node
// through its life: its labels and taints, a static pod, its CSINode, a
// restart that keeps the containers, containerd killed and restarted, and
// killall leaving nothing behind.
func TestNodeLifecycle(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.AddImage(testcluster.BuildTestImage(t, testcluster.TestImage))
	podManifests := filepath.Join(n.Dir, "pods")
	c, _ := startWebNode(t, n, "--node-label", "kelp.test/role=edge", "--node-taint", "kelp.test/flaky=yes:PreferNoSchedule", "--pod-manifests", podManifests)

	t.Run("node labels and taints", func(t *testing.T) {
		node, err := c.CoreV1().Nodes().Get(context.Background(), testcluster.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node.Labels["kelp.test/role"] != "edge" {
			t.Errorf("labels %v lack kelp.test/role=edge", node.Labels)
		}
		if len(node.Spec.Taints) != 1 || node.Spec.Taints[0].Key != "kelp.test/flaky" || node.Spec.Taints[0].Effect != corev1.TaintEffectPreferNoSchedule {
			t.Errorf("taints %v, want kelp.test/flaky=yes:PreferNoSchedule", node.Spec.Taints)
		}
		if node.Spec.PodCIDR == "" || !strings.HasPrefix(node.Spec.PodCIDR, "10.42.") {
			t.Errorf("pod CIDR %q, want a /24 of 10.42.0.0/16", node.Spec.PodCIDR)
		}
	})
	t.Run("static pod", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(podManifests, "static-web.yaml"), []byte(staticPod), 0o600); err != nil {
			t.Fatal(err)
		}
		var last string
		ok := wait.PollUntilContextTimeout(context.Background(), time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
			p, err := c.CoreV1().Pods("default").Get(ctx, "static-web-"+testcluster.NodeName, metav1.GetOptions{})
			last = fmt.Sprintf("%v %+v", err, p.Status)
			return err == nil && p.Status.Phase == corev1.PodRunning, nil
		})
		if ok != nil {
			var seen []string
			for _, line := range strings.Split(n.Log(), "\n") {
				if strings.Contains(line, "static-web") || strings.Contains(line, "pod-manifests") || strings.Contains(line, "pods\"") {
					seen = append(seen, line)
				}
			}
			t.Fatalf("the static pod's mirror pod is not running: %s\nthe kubelet on it:\n%s", last, strings.Join(seen, "\n"))
		}
	})

	t.Run("the kubelet's CSINode", func(t *testing.T) {
		// Upstream's CSI volume plugin keeps the node it serves in a
		// package variable, which the controller-manager's volume
		// controllers overwrite with no node: the kubelet's must come last
		// (controllermanager.Built), or its CSINode is never made.
		csiNode, err := c.StorageV1().CSINodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil || csiNode.Annotations["storage.alpha.kubernetes.io/migrated-plugins"] == "" {
			t.Errorf("the kubelet did not initialize the node's CSINode: %v", err)
		}
		if n.Logged("Failed to initialize CSINode") {
			t.Error("the kubelet failed to initialize the node's CSINode at least once")
		}
	})
	t.Run("restart keeps containers", func(t *testing.T) {
		before := containerIDs(t, c)
		n.Stop()
		n.Start("--pod-manifests", podManifests)
		n.WaitReady(startTimeout)
		n.WaitLog("kelp node is running", startTimeout)
		waitNodeReady(t, c)
		kubectl(t, n, "wait", "--for=condition=Available", "deployment/web", "--timeout=60s")
		if after := containerIDs(t, c); !equalMaps(before, after) {
			t.Errorf("containers changed across a restart:\nbefore %v\nafter  %v", before, after)
		}
	})
	t.Run("containerd killed", func(t *testing.T) {
		before := containerIDs(t, c)
		pid := bundledContainerd(t, n)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill containerd: %v", err)
		}
		n.WaitLog("containerd restarted", time.Minute)
		testcluster.Eventually(t, "crictl ps answers again", func() (bool, error) {
			out, err := n.RunKelp(time.Minute, "crictl", "ps")
			return err == nil && strings.Contains(out, " web "), nil
		})
		waitNodeReady(t, c)
		if pid2 := bundledContainerd(t, n); pid2 == pid {
			t.Errorf("containerd %d still runs after kill -9", pid)
		}
		if after := containerIDs(t, c); !equalMaps(before, after) {
			t.Errorf("containers changed across a containerd restart:\nbefore %v\nafter  %v", before, after)
		}
	})
	t.Run("killall", func(t *testing.T) {
		n.Stop()
		if out, err := n.RunKelp(time.Minute, "killall", "--data-dir", n.DataDir); err != nil {
			t.Fatalf("killall: %v\n%s", err, out)
		}
		nothingLeft(t, n)
	})
}

// startWebNode starts `kelp server` with its node on n, with args, and
// runs workload on it; it returns the admin client and the web pods.
func startWebNode(t *testing.T, n *testcluster.Node, args ...string) (kubernetes.Interface, []corev1.Pod) {
	t.Helper()
	startServerNode(n, args...)
	c := n.Client()
	waitNodeReady(t, c)
	waitServiceAccount(t, c, "default")
	apply(t, n, workload)
	kubectl(t, n, "wait", "--for=condition=Available", "deployment/web", "--timeout=120s")
	kubectl(t, n, "wait", "--for=condition=Complete", "job/once", "--timeout=60s")
	return c, webPods(t, c)
}

// bundledContainerd returns the pid of the node's containerd, which must be
// the binary of the bundle staged in its data dir, not kelp.
func bundledContainerd(t *testing.T, n *testcluster.Node) int {
	t.Helper()
	var pids []int
	for _, p := range n.Processes() {
		if pid, comm, _ := strings.Cut(p, " "); comm == "containerd" {
			id, err := strconv.Atoi(pid)
			if err != nil {
				t.Fatal(err)
			}
			pids = append(pids, id)
		}
	}
	if len(pids) != 1 {
		t.Fatalf("want one containerd process, got %v among %v", pids, n.Processes())
	}
	exe, err := n.Run(time.Minute, n.Command("readlink", fmt.Sprintf("/proc/%d/exe", pids[0])))
	if err != nil {
		t.Fatalf("containerd's binary: %v %s", err, exe)
	}
	if bundle := filepath.Join(n.DataDir, "data") + "/"; !strings.HasPrefix(exe, bundle) || filepath.Base(strings.TrimSpace(exe)) != "containerd" {
		t.Errorf("containerd runs %s, want the bundle's under %s", exe, bundle)
	}
	return pids[0]
}

// nothingLeft checks that killall removed every process, mount, interface,
// nftables table and cgroup of the node.
func nothingLeft(t *testing.T, n *testcluster.Node) {
	t.Helper()
	if procs := n.Processes(); len(procs) > 0 {
		t.Errorf("processes left: %v", procs)
	}
	out, _ := n.Run(time.Minute, n.Command("cat", "/proc/self/mountinfo"))
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 4 && (strings.HasPrefix(f[4], n.DataDir) || strings.HasPrefix(f[4], "/var/lib/kubelet/") || strings.HasPrefix(f[4], "/run/netns/")) {
			t.Errorf("mount left: %s", f[4])
		}
	}
	if out, err := n.Run(time.Minute, n.Command("ip", "-o", "link", "show")); err != nil || strings.Contains(out, "cni0") || strings.Contains(out, "veth") || strings.Contains(out, "kelp.vxlan") {
		t.Errorf("interfaces left: %v\n%s", err, out)
	}
	if out, err := n.Run(time.Minute, n.Command("ip", "-o", "addr", "show", "dev", "lo")); err != nil || strings.Contains(out, "10.43.0.10") {
		t.Errorf("the cluster DNS address is left on lo: %v\n%s", err, out)
	}
	var tables []*nftables.Table
	if err := n.InNetns(func() error {
		c, err := nftables.New()
		if err == nil {
			tables, err = c.ListTables()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		t.Errorf("nftables table left: %s", tb.Name)
	}
	// In the node's own view of the cgroups, where its kubelet made them:
	// the machine's may hold the kubepods of other tests' nodes.
	// A test node's data dir is not the default: its pods have a cgroup
	// root of their own, kelp_<hash>.
	if out, _ := n.Run(time.Minute, n.Command("sh", "-c", "ls -d /sys/fs/cgroup/kubepods* /sys/fs/cgroup/*/kubepods* /sys/fs/cgroup/kelp_* /sys/fs/cgroup/*/kelp_* 2>/dev/null")); strings.TrimSpace(out) != "" {
		t.Errorf("cgroups left: %s", out)
	}
}

func kubectl(t *testing.T, n *testcluster.Node, args ...string) string {
	t.Helper()
	out, err := n.Kubectl(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func waitNodeReady(t *testing.T, c kubernetes.Interface) {
	t.Helper()
	waitNodesReady(t, c, 1)
}

// waitServiceAccount waits for the controller-manager to make the default
// service account of namespace, without which no pod is admitted there.
func waitServiceAccount(t *testing.T, c kubernetes.Interface, namespace string) {
	t.Helper()
	testcluster.Eventually(t, "the default service account of "+namespace, func() (bool, error) {
		_, err := c.CoreV1().ServiceAccounts(namespace).Get(context.Background(), "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

func webPods(t *testing.T, c kubernetes.Interface) []corev1.Pod {
	t.Helper()
	list, err := c.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 {
		t.Fatalf("%d web pods, want 2", len(list.Items))
	}
	return list.Items
}

// containerIDs maps each web pod to its container ID and restart count.
func containerIDs(t *testing.T, c kubernetes.Interface) map[string]string {
	t.Helper()
	ids := map[string]string{}
	for _, p := range webPods(t, c) {
		for _, s := range p.Status.ContainerStatuses {
			ids[p.Name] = fmt.Sprintf("%s restarts=%d", s.ContainerID, s.RestartCount)
		}
	}
	return ids
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func portForward(t *testing.T, n *testcluster.Node, pod string) {
	t.Helper()
	cmd := n.Command(testcluster.Binary(t), "kubectl", "--kubeconfig", n.Kubeconfig, "port-forward", "pod/"+pod, "18080:8080")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	line := make([]byte, 64)
	if _, err := io.ReadAtLeast(out, line, 10); err != nil {
		t.Fatalf("port-forward did not start: %v", err)
	}
	client := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: n.DialContext}}
	resp, err := client.Get("http://127.0.0.1:18080/")
	if err != nil {
		t.Fatalf("through port-forward: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.HasPrefix(string(body), pod+" 127.0.0.1:") {
		t.Errorf("through port-forward: %q", body)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
