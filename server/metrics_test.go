package server_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// metricsWorkload is what TestMetrics measures: a Deployment that sinks
// TCP (and so uses CPU while something writes to it), autoscaled on its
// CPU, and a pod that writes to it, deleted to take the load away. The
// limits keep the test from taking the machine.
const metricsWorkload = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: sink}
spec:
  replicas: 1
  selector: {matchLabels: {app: sink}}
  template:
    metadata: {labels: {app: sink}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: sink
        image: ` + testcluster.TestImage + `
        imagePullPolicy: IfNotPresent
        args: [sink]
        resources:
          requests: {cpu: 10m}
          limits: {cpu: 200m}
---
apiVersion: v1
kind: Service
metadata: {name: sink}
spec:
  selector: {app: sink}
  ports: [{port: 9000}]
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: sink}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: sink}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
  behavior:
    scaleDown: {stabilizationWindowSeconds: 0}
`

// metricsLoad writes to the sink for ten minutes, from outside the
// autoscaled Deployment.
const metricsLoad = `
apiVersion: v1
kind: Pod
metadata: {name: load}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: load
    image: ` + testcluster.TestImage + `
    imagePullPolicy: IfNotPresent
    args: [blast, "sink:9000", "600"]
    resources:
      limits: {cpu: 200m}
`

// TestMetrics runs a server with its node and checks the metrics API that
// the server serves itself: kubectl top nodes and pods, and a
// HorizontalPodAutoscaler that scales a Deployment up under load and down
// once the load is gone.
func TestMetrics(t *testing.T) {
	t.Parallel()
	// A node of a lab has cgroups of its own, which no other test's
	// kubelet removes.
	n := testcluster.NewLab(t).NewNode("server", "10.99.0.2")
	n.Agent = true
	n.AddImage(testcluster.BuildTestImage(t, testcluster.TestImage))
	n.Start()
	n.WaitReady(startTimeout)
	n.WaitLog("kelp node is running", startTimeout)
	c := n.Client()
	waitNodeReady(t, c)
	waitServiceAccount(t, c, "default")
	apply(t, n, metricsWorkload)

	var available int
	t.Run("APIService", func(t *testing.T) {
		testcluster.Eventually(t, "the APIService v1beta1.metrics.k8s.io is Available", func() (bool, error) {
			out, err := n.Kubectl("get", "apiservice", "v1beta1.metrics.k8s.io", "-o", `jsonpath={.status.conditions[?(@.type=="Available")].status}`)
			return err == nil && out == "True", nil
		})
		available = len(n.Log())
	})
	t.Run("top nodes", func(t *testing.T) {
		var out string
		testcluster.Eventually(t, "kubectl top nodes shows the node", func() (bool, error) {
			var err error
			out, err = n.Kubectl("top", "nodes", "--no-headers")
			return err == nil && strings.HasPrefix(out, n.Name+" "), nil
		})
		// NAME CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%)
		f := strings.Fields(out)
		if len(f) < 5 || millicores(f[1]) <= 0 || !strings.HasSuffix(f[3], "Mi") {
			t.Errorf("kubectl top nodes: %q, want the node's CPU and memory", out)
		}
	})

	apply(t, n, metricsLoad)
	t.Run("top pods", func(t *testing.T) {
		var out string
		testcluster.EventuallyWithin(t, 90*time.Second, "kubectl top pods shows the sink working", func() (bool, error) {
			var err error
			out, err = n.Kubectl("top", "pods", "-l", "app=sink", "--no-headers")
			f := strings.Fields(out)
			return err == nil && len(f) >= 3 && millicores(f[1]) >= 5, nil
		})
		if f := strings.Fields(out); !strings.HasPrefix(f[0], "sink-") || !strings.HasSuffix(f[2], "Mi") {
			t.Errorf("kubectl top pods: %q", out)
		}
		testcluster.Eventually(t, "kubectl top pods -A shows the load pod too", func() (bool, error) {
			out, err := n.Kubectl("top", "pods", "-A", "--no-headers")
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); err == nil && len(f) >= 3 && f[0] == "default" && f[1] == "load" {
					return true, nil
				}
			}
			return false, nil
		})
	})
	t.Run("autoscaling", func(t *testing.T) {
		replicas := func() int {
			out, _ := n.Kubectl("get", "deployment", "sink", "-o", "jsonpath={.spec.replicas}")
			r, _ := strconv.Atoi(out)
			return r
		}
		testcluster.EventuallyWithin(t, 2*time.Minute, "the HPA scales the sink up under load", func() (bool, error) {
			return replicas() > 1, nil
		})
		kubectl(t, n, "delete", "pod", "load", "--wait=false")
		testcluster.EventuallyWithin(t, 3*time.Minute, "the HPA scales the sink down without load", func() (bool, error) {
			return replicas() == 1, nil
		})
	})
	// Until the API listens, the aggregator cannot reach it; from then on
	// it must find all it asks for (discovery, the OpenAPI spec).
	if failed := grepLines(grepLines(n.Log()[available:], "metrics.k8s.io"), "level=error"); failed != "" {
		t.Errorf("the aggregator failed on the metrics API:\n%s", failed)
	}
	if warned := grepLines(grepLines(n.Log(), "component=metrics"), "level=warning"); warned != "" {
		t.Errorf("warnings about the metrics of a healthy node:\n%s", warned)
	}
}

// millicores reads a CPU figure as kubectl top prints it ("12m").
func millicores(s string) int {
	m, err := strconv.Atoi(strings.TrimSuffix(s, "m"))
	if err != nil {
		return -1
	}
	return m
}

func grepLines(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
