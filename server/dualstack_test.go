package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// dualStackClient is a pod beside the server's web pod, on the same node.
const dualStackClient = `
apiVersion: v1
kind: Pod
metadata: {name: client, labels: {app: client}}
spec:
  nodeName: server
  terminationGracePeriodSeconds: 0
  containers:
  - name: client
    image: ` + testcluster.TestImage + `
    imagePullPolicy: IfNotPresent
    args: [serve]
`

// dualStackService is the client pod's Service, of both families.
const dualStackService = `
apiVersion: v1
kind: Service
metadata: {name: client}
spec:
  ipFamilyPolicy: PreferDualStack
  selector: {app: client}
  ports: [{port: 80, targetPort: 8080}]
`

// denyClient isolates the client pod: no traffic in, of either family.
const denyClient = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-client}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Ingress]
`

// TestDualStack runs a dual-stack cluster (10.42.0.0/16,fd42::/56 and
// 10.43.0.0/16,fd43::/112) of a server and an agent, each with an IPv4 and
// an IPv6 node IP: each node gets a pod range of each family and both
// addresses, each pod one address of each family from its node's ranges;
// a pod reaches another on its node by its IPv6 address, seen with its
// own; a pod on the agent reaches the server node over IPv6, masqueraded
// to its node's address. Pod to pod across nodes over IPv6 is the
// overlay's, tested where the overlay carries IPv6. Two nodes that cannot
// run in the cluster are refused at their join, saying why: one without
// an IPv6 address, one with IPv6 disabled.
func TestDualStack(t *testing.T) {
	t.Parallel()
	lab := testcluster.NewLab(t)
	image := testcluster.BuildTestImage(t, testcluster.TestImage)
	srv := lab.NewDualStackNode("server", "10.99.0.2", "fd99::2")
	srv.AddImage(image)
	agent := lab.NewDualStackNode("agent-1", "10.99.0.3", "fd99::3")
	agent.AddImage(image)
	startServerAndAgent(srv, agent, "--cluster-cidr", "10.42.0.0/16,fd42::/56", "--service-cidr", "10.43.0.0/16,fd43::/112")
	c := srv.Client()
	waitNodesReady(t, c, 2)

	podRanges := map[string][]netip.Prefix{}
	for _, n := range []*testcluster.Node{srv, agent} {
		testcluster.Eventually(t, n.Name+"'s pod ranges and addresses", func() (bool, error) {
			node, err := c.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
			if err != nil || len(node.Spec.PodCIDRs) != 2 {
				return false, nil
			}
			var ranges []netip.Prefix
			for _, s := range node.Spec.PodCIDRs {
				p, err := netip.ParsePrefix(s)
				if err != nil {
					return false, err
				}
				ranges = append(ranges, p)
			}
			if !netip.MustParsePrefix("10.42.0.0/16").Contains(ranges[0].Addr()) || ranges[0].Bits() != 24 ||
				!netip.MustParsePrefix("fd42::/56").Contains(ranges[1].Addr()) || ranges[1].Bits() != 64 {
				return false, fmt.Errorf("pod ranges %v, want a /24 of 10.42.0.0/16 and a /64 of fd42::/56", ranges)
			}
			podRanges[n.Name] = ranges
			internal := map[string]bool{}
			for _, a := range node.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					internal[a.Address] = true
				}
			}
			return internal[n.IP] && internal[n.IP6], nil
		})
	}
	if svc, err := c.CoreV1().Services("default").Get(context.Background(), "kubernetes", metav1.GetOptions{}); err != nil || svc.Spec.ClusterIP != "10.43.0.1" {
		t.Errorf("the kubernetes Service's ClusterIP: %v %v", svc.Spec.ClusterIP, err)
	}

	waitServiceAccount(t, c, "default")
	apply(t, srv, spreadWorkload+"---\n"+dualStackClient+"---\n"+dualStackService)
	rolloutStatus(t, srv, "daemonset/web", 170*time.Second)
	testcluster.Eventually(t, "the client pod", func() (bool, error) {
		p, err := c.CoreV1().Pods("default").Get(context.Background(), "client", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning && len(p.Status.PodIPs) == 2, nil
	})
	pods := podsByNode(t, c, "app=web")
	client, err := c.CoreV1().Pods("default").Get(context.Background(), "client", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v6 := map[string]string{} // pod name → IPv6 address
	all := []corev1.Pod{*client}
	for _, p := range pods {
		all = append(all, p)
	}
	for _, p := range all {
		if len(p.Status.PodIPs) != 2 {
			t.Fatalf("pod %s has addresses %v, want one of each family", p.Name, p.Status.PodIPs)
		}
		for i, ip := range p.Status.PodIPs {
			a, err := netip.ParseAddr(ip.IP)
			if err != nil || !podRanges[p.Spec.NodeName][i].Contains(a) {
				t.Errorf("pod %s on %s: address %d %s is not of the node's pod range %v", p.Name, p.Spec.NodeName, i, ip.IP, podRanges[p.Spec.NodeName][i])
			}
		}
		v6[p.Name] = p.Status.PodIPs[1].IP
	}
	exec := func(pod string, args ...string) (string, error) {
		out, err := srv.Kubectl(append([]string{"exec", pod, "--"}, args...)...)
		return strings.TrimSpace(out), err
	}

	t.Run("pod to pod on a node over IPv6", func(t *testing.T) {
		web := pods["server"]
		testcluster.Eventually(t, "the client reaches the server's web pod by its IPv6 address", func() (bool, error) {
			out, err := exec("client", "/testapp", "get", "http://"+net.JoinHostPort(v6[web.Name], "8080")+"/", "3s")
			return err == nil && strings.HasPrefix(out, web.Name+" "+net.JoinHostPort(v6["client"], "")), nil
		})
	})
	t.Run("pod to pod across nodes over IPv6", func(t *testing.T) {
		web := pods["agent-1"]
		testcluster.Eventually(t, "the client reaches the agent's web pod by its IPv6 address", func() (bool, error) {
			out, err := exec("client", "/testapp", "get", "http://"+net.JoinHostPort(v6[web.Name], "8080")+"/", "3s")
			return err == nil && strings.HasPrefix(out, web.Name+" "+net.JoinHostPort(v6["client"], "")), nil
		})
	})
	svc, err := c.CoreV1().Services("default").Get(context.Background(), "client", metav1.GetOptions{})
	if err != nil || len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("the PreferDualStack Service client: ClusterIPs %v, %v", svc.Spec.ClusterIPs, err)
	}
	fromAgent := func(ip string) (string, error) {
		return exec(pods["agent-1"].Name, "/testapp", "get", "http://"+net.JoinHostPort(ip, "80")+"/", "3s")
	}
	t.Run("a PreferDualStack Service over both families from the other node", func(t *testing.T) {
		for _, ip := range svc.Spec.ClusterIPs {
			testcluster.Eventually(t, "the client Service at "+ip+" from the agent's pod", func() (bool, error) {
				out, err := fromAgent(ip)
				return err == nil && strings.HasPrefix(out, "client "), nil
			})
		}
	})
	t.Run("DNS answers both families", func(t *testing.T) {
		testcluster.Eventually(t, "A and AAAA of the client Service", func() (bool, error) {
			out, err := exec(pods["agent-1"].Name, "/testapp", "lookup", "client.default.svc.cluster.local")
			got := strings.Fields(out)
			slices.Sort(got)
			want := slices.Clone(svc.Spec.ClusterIPs)
			slices.Sort(want)
			return err == nil && slices.Equal(got, want), nil
		})
		testcluster.Eventually(t, "PTR of the IPv6 ClusterIP", func() (bool, error) {
			out, err := exec(pods["agent-1"].Name, "/testapp", "ptr", svc.Spec.ClusterIPs[1])
			return err == nil && out == "client.default.svc.cluster.local.", nil
		})
	})
	t.Run("a NetworkPolicy denies IPv6 as it does IPv4", func(t *testing.T) {
		apply(t, srv, denyClient)
		for _, ip := range append(slices.Clone(svc.Spec.ClusterIPs), client.Status.PodIPs[0].IP, client.Status.PodIPs[1].IP) {
			port := "80"
			if !slices.Contains(svc.Spec.ClusterIPs, ip) {
				port = "8080"
			}
			testcluster.Eventually(t, "the client pod isolated at "+ip, func() (bool, error) {
				_, err := exec(pods["agent-1"].Name, "/testapp", "get", "http://"+net.JoinHostPort(ip, port)+"/", "2s")
				return err != nil, nil
			})
		}
		kubectl(t, srv, "delete", "networkpolicy", "deny-client")
		for _, ip := range svc.Spec.ClusterIPs {
			testcluster.Eventually(t, "the client Service at "+ip+" once the policy is gone", func() (bool, error) {
				out, err := fromAgent(ip)
				return err == nil && strings.HasPrefix(out, "client "), nil
			})
		}
	})
	t.Run("node to its pod over IPv6", func(t *testing.T) {
		web := pods["server"]
		hc := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: srv.DialContext, DisableKeepAlives: true}}
		testcluster.Eventually(t, "the server node reaches its web pod by its IPv6 address", func() (bool, error) {
			resp, err := hc.Get("http://" + net.JoinHostPort(v6[web.Name], "8080") + "/")
			if err != nil {
				return false, nil
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, nil
		})
	})
	t.Run("pod egress over IPv6 leaves with the node's address", func(t *testing.T) {
		l, err := srv.Listen("tcp", net.JoinHostPort(srv.IP6, "7000"))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				host, _, _ := net.SplitHostPort(r.RemoteAddr)
				fmt.Fprintln(w, host)
			}))
		}()
		testcluster.Eventually(t, "the agent's pod reaches the server node over IPv6", func() (bool, error) {
			out, err := exec(pods["agent-1"].Name, "/testapp", "get", "http://"+net.JoinHostPort(srv.IP6, "7000")+"/", "3s")
			if err != nil {
				return false, nil
			}
			if out != agent.IP6 {
				return false, fmt.Errorf("seen as %q, want the agent node's %s", out, agent.IP6)
			}
			return true, nil
		})
	})
	t.Run("a node that cannot run IPv6 is refused at its join", func(t *testing.T) {
		n := lab.NewNode("agent-v4", "10.99.0.4")
		join := func() string {
			out, err := n.RunKelp(time.Minute, n.AgentArgs(srv.URL(), srv.TokenFile())...)
			if testcluster.ExitCode(err) != 1 {
				t.Errorf("exit %d, want 1:\n%s", testcluster.ExitCode(err), out)
			}
			return out
		}
		if out := join(); !strings.Contains(out, "this node has no IPv6 node IP (it has 10.99.0.4), and this machine has no global IPv6 address") {
			t.Errorf("a node without an IPv6 address:\n%s", out)
		}
		if out, err := n.Command("sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6").CombinedOutput(); err != nil {
			t.Fatalf("disable IPv6: %v\n%s", err, out)
		}
		if out := join(); !strings.Contains(out, "IPv6 is disabled on this machine (net.ipv6.conf.all.disable_ipv6=1): enable it") {
			t.Errorf("a node with IPv6 disabled:\n%s", out)
		}
		if _, err := c.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{}); err == nil {
			t.Errorf("a refused node registered")
		}
	})
}

// TestIPv6Only runs a server with its node on IPv6 alone (fd42::/56 and
// fd43::/112, node IP fd99::2): the kubernetes Service and the cluster
// DNS are IPv6, a pod gets one IPv6 address and reaches a Service by its
// DNS name, answered AAAA.
func TestIPv6Only(t *testing.T) {
	t.Parallel()
	lab := testcluster.NewLab(t)
	srv := lab.NewDualStackNode("server", "10.99.0.2", "fd99::2")
	srv.IP6 = "" // its --node-ip is given below: the IPv6 one alone
	srv.AddImage(testcluster.BuildTestImage(t, testcluster.TestImage))
	startServerNode(srv, "--node-ip", "fd99::2", "--cluster-cidr", "fd42::/56", "--service-cidr", "fd43::/112")
	c := srv.Client()
	waitNodeReady(t, c)
	if svc, err := c.CoreV1().Services("default").Get(context.Background(), "kubernetes", metav1.GetOptions{}); err != nil || svc.Spec.ClusterIP != "fd43::1" {
		t.Errorf("the kubernetes Service's ClusterIP: %v %v", svc.Spec.ClusterIP, err)
	}
	waitServiceAccount(t, c, "default")
	apply(t, srv, dualStackClient+"---\n"+dualStackService)
	testcluster.Eventually(t, "the client pod", func() (bool, error) {
		p, err := c.CoreV1().Pods("default").Get(context.Background(), "client", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning && len(p.Status.PodIPs) > 0, nil
	})
	client, err := c.CoreV1().Pods("default").Get(context.Background(), "client", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ips := client.Status.PodIPs; len(ips) != 1 || !netip.MustParsePrefix("fd42::/56").Contains(netip.MustParseAddr(ips[0].IP)) {
		t.Fatalf("the pod's addresses %v, want one of fd42::/56", ips)
	}
	svc, err := c.CoreV1().Services("default").Get(context.Background(), "client", metav1.GetOptions{})
	if err != nil || len(svc.Spec.ClusterIPs) != 1 || !strings.HasPrefix(svc.Spec.ClusterIP, "fd43::") {
		t.Fatalf("the client Service's ClusterIPs %v, %v", svc.Spec.ClusterIPs, err)
	}
	testcluster.Eventually(t, "the client Service by its DNS name, over IPv6", func() (bool, error) {
		out, err := srv.Kubectl("exec", "client", "--", "/testapp", "get", "http://client.default.svc.cluster.local/", "3s")
		return err == nil && strings.HasPrefix(out, "client "), nil
	})
	out, err := srv.Kubectl("exec", "client", "--", "/testapp", "lookup", "client.default.svc.cluster.local")
	if err != nil || strings.TrimSpace(out) != svc.Spec.ClusterIP {
		t.Errorf("lookup of the client Service: %q %v, want %s", out, err, svc.Spec.ClusterIP)
	}
}
