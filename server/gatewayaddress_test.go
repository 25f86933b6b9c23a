package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// gatewayAddressApp is two apps, each behind a Gateway of its own with
// one listener on port 80 and no hostname, and a route for / to the app:
// on shared addresses nothing would tell the two apart. The apps run on
// the server, which stays up.
var gatewayAddressApp = gatewayAddressAppOf("one") + "---\n" + gatewayAddressAppOf("two")

// gatewayAddressAppOf is the app name, answering with its pod's name, its
// Service, Gateway and HTTPRoute, all named name.
func gatewayAddressAppOf(name string) string {
	return testcluster.App{Name: name, Node: "server", Ready: true}.YAML() + strings.ReplaceAll(`---
apiVersion: v1
kind: Service
metadata: {name: NAME}
spec:
  selector: {app: NAME}
  ports: [{port: 80, targetPort: http}]
---
`+port80Gateway("NAME")+`
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: NAME}
spec:
  parentRefs: [{name: NAME}]
  rules: [{backendRefs: [{name: NAME, port: 80}]}]
`, "NAME", name)
}

// port80Gateway is a Gateway of the class kelp with one HTTP listener on
// port 80 and no hostname.
func port80Gateway(name string) string {
	return `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: ` + name + `}
spec:
  gatewayClassName: kelp
  listeners: [{name: http, protocol: HTTP, port: 80}]`
}

// TestGatewayAddresses runs a server and an agent with
// --gateway-address-range and a client machine on their network. Two
// Gateways on port 80 get an address each and answer with their own app
// there, and neither on a node's address; a third finds the range used
// up. An address moves to the other node when its node is cordoned, not
// back when it is uncordoned, and to the other node again when its node
// stops, and the client's ARP cache follows.
func TestGatewayAddresses(t *testing.T) {
	t.Parallel()
	lab := testcluster.NewLab(t)
	image := testcluster.BuildTestImage(t, testcluster.TestImage)
	srv := lab.NewNode("server", "10.99.0.2")
	srv.AddImage(image)
	agent := lab.NewNode("agent-1", "10.99.0.3")
	// The node lifecycle controller's grace shortened from 50 s, so that a
	// stopped node is NotReady soon.
	startServerAndAgent(srv, agent, "--gateway-address-range", "10.99.0.200-10.99.0.201", "--kube-controller-manager-arg", "node-monitor-grace-period=20s")
	client := lab.NewNode("client", "10.99.0.9")
	c := srv.Client()
	waitNodesReady(t, c, 2)
	waitServiceAccount(t, c, "default")
	gw, err := gatewayclient.NewForConfig(srv.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, "the GatewayClass kelp", func() (bool, error) {
		gc, err := gw.GatewayV1().GatewayClasses().Get(context.Background(), "kelp", metav1.GetOptions{})
		return err == nil && apimeta.IsStatusConditionTrue(gc.Status.Conditions, "Accepted"), nil
	})
	apply(t, srv, gatewayAddressApp)
	kubectl(t, srv, "wait", "--for=condition=Available", "deployment/one", "deployment/two", "--timeout=120s")

	addrs := map[string]string{}
	for _, name := range []string{"one", "two"} {
		testcluster.Eventually(t, "Gateway "+name+" programmed on an address of its own", func() (bool, error) {
			g, err := gw.GatewayV1().Gateways("default").Get(context.Background(), name, metav1.GetOptions{})
			if err != nil || !apimeta.IsStatusConditionTrue(g.Status.Conditions, "Programmed") || len(g.Status.Addresses) != 1 {
				return false, nil
			}
			addrs[name] = g.Status.Addresses[0].Value
			return true, nil
		})
	}
	if addrs["one"] == addrs["two"] || !strings.HasPrefix(addrs["one"], "10.99.0.20") || !strings.HasPrefix(addrs["two"], "10.99.0.20") {
		t.Fatalf("the Gateways' addresses %v, want 10.99.0.200 and 10.99.0.201 apart", addrs)
	}

	httpClient := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: client.DialContext, DisableKeepAlives: true}}
	get := func(addr string) (int, string, error) {
		resp, err := httpClient.Get("http://" + net.JoinHostPort(addr, "80") + "/")
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), nil
	}
	reachBoth := func(when string) {
		t.Helper()
		for _, name := range []string{"one", "two"} {
			testcluster.Eventually(t, when+": app "+name+" at its Gateway's address "+addrs[name]+" from the client", func() (bool, error) {
				code, body, err := get(addrs[name])
				return err == nil && code == http.StatusOK && strings.HasPrefix(body, name+"-"), nil
			})
		}
	}
	reachBoth("at first")
	for _, n := range []*testcluster.Node{srv, agent} {
		if code, _, err := get(n.IP); err != nil || code != http.StatusNotFound {
			t.Errorf("node %s's own address: %d %v, want 404 (no Gateway is on it)", n.Name, code, err)
		}
	}

	apply(t, srv, port80Gateway("three"))
	testcluster.Eventually(t, "Gateway three: Programmed False, AddressNotAssigned", func() (bool, error) {
		g, err := gw.GatewayV1().Gateways("default").Get(context.Background(), "three", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got := apimeta.FindStatusCondition(g.Status.Conditions, "Programmed")
		return got != nil && got.Status == metav1.ConditionFalse && got.Reason == "AddressNotAssigned" && strings.Contains(got.Message, "10.99.0.200-10.99.0.201"), nil
	})

	// holds says whether n has addr on its interface.
	holds := func(n *testcluster.Node, addr string) bool {
		out, err := n.Command("ip", "-o", "-4", "addr", "show", "dev", "eth0").CombinedOutput()
		if err != nil {
			t.Fatalf("node %s: ip addr: %v\n%s", n.Name, err, out)
		}
		return strings.Contains(string(out), " "+addr+"/32 ")
	}
	// arpTo says whether the client's neighbour entry of addr is n's
	// MAC, and what the entry is.
	arpTo := func(n *testcluster.Node, addr string) (bool, string) {
		// ip, not /sys/class/net: the node's /sys is the machine's.
		link, err := n.Command("ip", "-o", "link", "show", "dev", "eth0").Output()
		if err != nil {
			t.Fatal(err)
		}
		_, mac, _ := strings.Cut(string(link), "link/ether ")
		mac, _, _ = strings.Cut(mac, " ")
		out, _ := client.Command("ip", "neigh", "show", addr).Output()
		entry := strings.TrimSpace(string(out))
		return mac != "" && strings.Contains(entry, "lladdr "+mac+" "), fmt.Sprintf("%q, %s's MAC %s", entry, n.Name, mac)
	}
	movedTo := func(n, from *testcluster.Node) {
		t.Helper()
		for _, name := range []string{"one", "two"} {
			testcluster.Eventually(t, "node "+n.Name+" holds "+addrs[name], func() (bool, error) {
				return holds(n, addrs[name]) && !holds(from, addrs[name]), nil
			})
		}
	}

	// neighbourIs checks, before the client sends anything, that its
	// neighbour entries of the addresses name n's MAC: n announced them.
	// Else it would send to the node that held them, which forwards.
	neighbourIs := func(n *testcluster.Node) {
		t.Helper()
		for _, name := range []string{"one", "two"} {
			testcluster.EventuallyWithin(t, 10*time.Second, fmt.Sprintf("the client's neighbour entry of %s names %s's MAC", addrs[name], n.Name), func() (bool, error) {
				ok, entry := arpTo(n, addrs[name])
				return ok, fmt.Errorf("it is %s", entry)
			})
		}
	}

	kubectl(t, srv, "cordon", "server")
	movedTo(agent, srv)
	neighbourIs(agent)
	reachBoth("the server cordoned")
	kubectl(t, srv, "uncordon", "server")
	// An address stays where it is while its node may hold it: a move
	// breaks the connections open to it.
	time.Sleep(5 * time.Second)
	for _, name := range []string{"one", "two"} {
		if !holds(agent, addrs[name]) || holds(srv, addrs[name]) {
			t.Errorf("%s moved when the server was uncordoned", addrs[name])
		}
	}

	began := time.Now()
	agent.Stop()
	movedTo(srv, agent)
	t.Logf("from the agent's stop to the server holding its addresses: %s", time.Since(began).Round(time.Second))
	neighbourIs(srv)
	reachBoth("the agent stopped")
}
