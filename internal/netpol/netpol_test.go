package netpol

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kelp-dev/kelp/internal/informer/informertest"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestRun follows Run on a node upgraded from a kelp before dual-stack
// through a policy change and a table changed behind its back, and checks
// it cleans up.
func TestRun(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		fd := testcluster.NetnsFD(t)
		// Run keeps this thread; the test looks at the namespace from others.
		c, err := nftables.New(nftables.WithNetNSFd(fd))
		if err != nil {
			t.Fatal(err)
		}
		addLegacyTable(t, c)
		client := fake.NewClientset(
			namespace("default", nil),
			pod("default", "web", "10.42.0.10", node, map[string]string{"app": "web"}, alsoIP("fd42::10")),
			pod("default", "remote", "10.42.1.10", "node-b", map[string]string{"app": "web"}),
			policy("default", "deny", networkingv1.NetworkPolicySpec{PolicyTypes: ingressOnly}),
		)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			defer cancel()
			// rules counts the rules of each chain of the table.
			rules := func() map[string]int {
				out := map[string]int{}
				chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
				if err != nil {
					return out
				}
				for _, ch := range chains {
					if rs, err := c.GetRules(ch.Table, ch); err == nil && ch.Table.Name == Table {
						out[ch.Name] = len(rs)
					}
				}
				return out
			}
			waitFor := func(what string, ok func(map[string]int) bool) bool {
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
					if ok(rules()) {
						return true
					}
				}
				t.Errorf("%s: never happened; chains and rules %v", what, rules())
				return false
			}
			denied := func(r map[string]int) bool { return r["forward"] == forwardRules && r["ingress-0"] == 1 }
			if !waitFor("deny all ingress of the local pod", denied) {
				return
			}
			if got, want := tableNames(t, c), []string{fmt.Sprintf("%d %s", nftables.TableFamilyINet, Table)}; !reflect.DeepEqual(got, want) {
				t.Errorf("tables %v, want %v: the legacy table removed", got, want)
			}
			if sets := setElements(t, c); sets["ingress-pods4"] != 1 || sets["ingress-pods6"] != 1 {
				t.Errorf("set elements %v: want the pod's IPv4 and IPv6 address isolated", sets)
			}
			if _, err := client.NetworkingV1().NetworkPolicies("default").Create(ctx, policy("default", "web", networkingv1.NetworkPolicySpec{
				Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}},
			}), metav1.CreateOptions{}); err != nil {
				t.Error(err)
				return
			}
			if !waitFor("allow port 80", func(r map[string]int) bool { return r["ingress-0"] == 2 }) {
				return
			}
			c.DelTable(inet)
			if err := c.Flush(); err != nil {
				t.Error(err)
				return
			}
			if !waitFor("the deleted table back", func(r map[string]int) bool { return r["ingress-0"] == 2 }) {
				return
			}
			c.FlushChain(&nftables.Chain{Name: "forward", Table: inet})
			if err := c.Flush(); err != nil {
				t.Error(err)
				return
			}
			waitFor("the flushed chain back", func(r map[string]int) bool { return r["forward"] == forwardRules })
		}()
		if err := run(ctx, informertest.Cache(t, client, TrimPod), Config{NodeName: node}, 50*time.Millisecond); err != nil {
			t.Errorf("run: %v", err)
		}
		// The policies stay enforced while kelp is stopped or restarts.
		if tables, err := c.ListTables(); err != nil || len(tables) != 1 {
			t.Errorf("after run: tables %v, %v; want the table kept", tables, err)
		}
	})
}

// The pods the informers hold are trimmed; what Compile reads survives.
func TestTrimPod(t *testing.T) {
	p := pod("default", "web", "10.42.0.10", node, map[string]string{"app": "web"},
		ports(corev1.ContainerPort{Name: "http", ContainerPort: 8080}))
	p.Annotations = map[string]string{"big": "yes"}
	p.Spec.Containers[0].Image = "web:1"
	got, err := TrimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := got.(*corev1.Pod)
	if trimmed.Annotations != nil || trimmed.Spec.Containers[0].Image != "" {
		t.Errorf("not trimmed: %+v", trimmed)
	}
	if trimmed.Spec.Containers[0].Ports[0].Name != "http" || trimmed.Labels["app"] != "web" || trimmed.Status.PodIP != "10.42.0.10" {
		t.Errorf("trimmed too much: %+v", trimmed)
	}
	ns := namespace("default", nil)
	if got, _ := TrimPod(ns); got != ns {
		t.Errorf("a namespace changed: %+v", got)
	}
}
