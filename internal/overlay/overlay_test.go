package overlay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kelp-dev/kelp/internal/informer/informertest"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		change func(*Config)
		err    string
	}{
		{change: func(*Config) {}},
		{change: func(c *Config) { c.Backend = BackendNone }},
		{change: func(c *Config) { c.Backend = "" }, err: `unknown overlay backend ""`},
		{change: func(c *Config) { c.Backend = "wireguard" }, err: `unknown overlay backend "wireguard"`},
		{change: func(c *Config) { c.NodeName = "" }, err: "no node name"},
		{change: func(c *Config) { c.NodeIPs = nil }, err: "no node IP: pass --node-ip"},
		{change: func(c *Config) { c.NodeIPs = []netip.Addr{{}} }, err: "node IP invalid IP"},
		{change: func(c *Config) { c.NodeIPs = addrs("0.0.0.0") }, err: "node IP 0.0.0.0: not a unicast IP address"},
		{change: func(c *Config) { c.NodeIPs = addrs("ff02::1") }, err: "node IP ff02::1: not a unicast"},
		{change: func(c *Config) { c.NodeIPs = addrs("::ffff:10.99.0.2") }, err: "node IP ::ffff:10.99.0.2: not a unicast"},
		{change: func(c *Config) { c.NodeIPs = addrs("10.99.0.2,10.99.0.3") }, err: "give at most one IPv4 node IP"},
		{change: func(c *Config) { c.NodeIPs = addrs("fd99::2") }},
		{change: func(c *Config) { c.NodeIPs = addrs("fd99::2,10.99.0.2") }},
		{change: func(c *Config) { c.NodeIPs = addrs("10.99.0.2,fd99::2,fd99::3") }, err: "give at most one IPv6 node IP"},
		{change: func(c *Config) { c.ClusterCIDRs = nil }, err: "no cluster CIDR"},
		{change: func(c *Config) { c.ClusterCIDRs = []netip.Prefix{{}} }, err: "cluster CIDR invalid Prefix"},
		{change: func(c *Config) { c.ClusterCIDRs = prefixes("10.42.0.0/16,10.44.0.0/16") }, err: "give at most one IPv4 cluster CIDR"},
		{change: func(c *Config) { c.ClusterCIDRs = prefixes("10.42.0.0/16,fd42::/56") }},
		{change: func(c *Config) { c.ClusterCIDRs = prefixes("fd42::/56,10.42.0.0/16") }},
		{change: func(c *Config) { c.ClusterCIDRs = prefixes("fd42::/56") }},
		{change: func(c *Config) { c.ClusterCIDRs = prefixes("fd42::/56,fd43::/56") }, err: "give at most one IPv6 cluster CIDR"},
		{change: func(c *Config) { *c = configOf(BackendHostGW, "10.99.0.2,fd99::2", "10.42.0.0/16,fd42::/56") }},
		{change: func(c *Config) { *c = configOf(BackendHostGW, "10.99.0.2", "10.42.0.0/16,fd42::/56") },
			err: "backend host-gw routes the IPv6 pods of cluster CIDR fd42::/56 via the nodes' IPv6 node IPs, and this node has none: add one to --node-ip, or use --overlay vxlan"},
		{change: func(c *Config) { *c = configOf(BackendHostGW, "fd99::2", "10.42.0.0/16") }, err: "IPv4 pods of cluster CIDR 10.42.0.0/16"},
	} {
		cfg := config(BackendVXLAN)
		tc.change(&cfg)
		err := cfg.Validate()
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("Validate(%+v) = %v, want %q", cfg, err, tc.err)
		}
	}
}

// The nodes the informer holds are trimmed; what Peers reads survives.
func TestTrimNode(t *testing.T) {
	cfg := configOf(BackendVXLAN, "10.99.0.2,fd99::2", "10.42.0.0/16,fd42::/56")
	n := node("node-b", "10.42.1.0/24,fd42:0:0:1::/64", BackendVXLAN, "10.99.0.3,fd99::3")
	n.Annotations["big"] = "yes"
	n.Labels = map[string]string{"kubernetes.io/hostname": "node-b"}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"pause"}}}
	got, err := TrimNode(n)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := got.(*corev1.Node)
	if trimmed.Annotations["big"] != "" || trimmed.Labels != nil || trimmed.Status.Images != nil {
		t.Errorf("not trimmed: %+v", trimmed)
	}
	want := Peers([]*corev1.Node{n}, cfg)
	if got := Peers([]*corev1.Node{trimmed}, cfg); len(want) != 1 || len(want[0].PodCIDRs) != 2 || len(want[0].IPs) != 2 || !reflect.DeepEqual(got, want) {
		t.Errorf("trimmed too much: Peers %+v, want %+v", got, want)
	}
	if got, _ := TrimNode(&corev1.Pod{}); got == nil {
		t.Error("a pod was dropped")
	}
}

// publish sets what is missing or wrong, removes what another backend
// left, and does not write when all is as it should be.
func TestPublish(t *testing.T) {
	stale := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: self, Annotations: map[string]string{
		AnnotationBackend: BackendVXLAN, AnnotationVTEPMAC: "0a:00:00:00:00:01", "other": "kept",
	}}}
	client := fake.NewClientset(stale)
	ctx := context.Background()
	for i, tc := range []struct {
		backend, ips string
		patch        bool
	}{
		{backend: BackendHostGW, ips: "10.99.0.2", patch: true},
		{backend: BackendVXLAN, ips: "10.99.0.2", patch: true},
		{backend: BackendVXLAN, ips: "10.99.0.2"},
		{backend: BackendVXLAN, ips: "10.99.0.2,fd99::2", patch: true},
		{backend: BackendVXLAN, ips: "fd99::2,10.99.0.2"},
		{backend: BackendVXLAN, ips: "fd99::2", patch: true},
	} {
		backend := tc.backend
		n, err := client.CoreV1().Nodes().Get(ctx, self, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before := len(client.Actions())
		if err := publish(ctx, client, n, configOf(backend, tc.ips, "10.42.0.0/16")); err != nil {
			t.Fatal(err)
		}
		if patched := len(client.Actions()) > before; patched != tc.patch {
			t.Errorf("%d: %s: patched %v, want %v", i, backend, patched, tc.patch)
		}
		n, err = client.CoreV1().Nodes().Get(ctx, self, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{AnnotationBackend: backend, "other": "kept"}
		for _, ip := range addrs(tc.ips) {
			if ip.Is6() {
				want[AnnotationPublicIPv6] = ip.String()
			} else {
				want[AnnotationPublicIP] = ip.String()
			}
		}
		if backend == BackendVXLAN {
			want[AnnotationVTEPMAC] = vtepMAC(self).String()
		}
		if fmt.Sprint(n.Annotations) != fmt.Sprint(want) {
			t.Errorf("%d: %s: annotations %v, want %v", i, backend, n.Annotations, want)
		}
	}
}

// TestRun follows Run from a node without a pod CIDR through peers that
// change and go, and entries deleted behind its back, and checks it leaves
// everything in place.
func TestRun(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		if err := addUplink("10.99.0.2/24"); err != nil {
			t.Fatal(err)
		}
		b := node("node-b", "10.42.1.0/24", BackendVXLAN, "10.99.0.3")
		client := fake.NewClientset(
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: self}},
			b,
			node("node-c", "10.42.2.0/24", BackendHostGW, "10.99.0.4"),
		)
		runBeside(t, client, config(BackendVXLAN), func(ctx context.Context) {
			var last state
			waitFor := func(what string, ok func(state) bool) bool {
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
					s, err := dump()
					if err != nil {
						t.Errorf("%s: %v", what, err)
						return false
					}
					if last = s; ok(s) {
						return true
					}
				}
				t.Errorf("%s: never happened; there is\n%s", what, last)
				return false
			}
			update := func(n *corev1.Node) bool {
				if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
					t.Error(err)
					return false
				}
				return true
			}
			routeB := "10.42.1.0/24 via 10.42.1.0 dev kelp.vxlan proto 0x6b onlink"

			if waitPublished(ctx, t, client, func(n *corev1.Node) bool {
				return n.Annotations[AnnotationVTEPMAC] == vtepMAC(self).String()
			}) == nil {
				return
			}
			// Without a pod CIDR there is a device, but no address and no
			// routes.
			if s, err := dump(); err != nil || s.Device == "" || s.Addrs != nil || s.Routes != nil {
				t.Errorf("before the node has a pod CIDR:\n%s\n%v", s, err)
			}
			a, err := client.CoreV1().Nodes().Get(ctx, self, metav1.GetOptions{})
			if err != nil {
				t.Error(err)
				return
			}
			a.Spec.PodCIDR = "10.42.0.0/24"
			if !update(a) || !waitFor("node-b routed", func(s state) bool {
				return slices.Equal(s.Addrs, []string{"10.42.0.0/32"}) && slices.Equal(s.Routes, []string{routeB}) &&
					slices.Equal(s.FDB, []string{vtepMAC("node-b").String() + " dst 10.99.0.3"}) && len(s.Neighs) == 1
			}) {
				return
			}
			dev, err := netlink.LinkByName(Device)
			if err == nil {
				err = netlink.RouteDel(&netlink.Route{LinkIndex: dev.Attrs().Index, Dst: prefixNet(netip.MustParsePrefix("10.42.1.0/24"))})
			}
			if err != nil {
				t.Errorf("delete the route to node-b: %v", err)
				return
			}
			if !waitFor("the deleted route back", func(s state) bool { return slices.Equal(s.Routes, []string{routeB}) }) {
				return
			}
			b.Annotations[AnnotationPublicIP] = "10.99.0.13"
			b.Annotations[AnnotationVTEPMAC] = "0a:00:00:00:00:0b"
			if !update(b) || !waitFor("node-b changed", func(s state) bool {
				return slices.Equal(s.FDB, []string{"0a:00:00:00:00:0b dst 10.99.0.13"}) &&
					slices.Equal(s.Neighs, []string{"10.42.1.0 lladdr 0a:00:00:00:00:0b dev kelp.vxlan"})
			}) {
				return
			}
			if err := client.CoreV1().Nodes().Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil {
				t.Error(err)
				return
			}
			waitFor("node-b gone", func(s state) bool { return s.Routes == nil && s.Neighs == nil && s.FDB == nil })
		})
		// The overlay stays while kelp is stopped or restarts.
		if s, err := dump(); err != nil || s.Device == "" || s.Addrs == nil {
			t.Errorf("after run:\n%s\n%v\nwant the device kept", s, err)
		}
	})
}

// TestRunDualStack runs a node of an IPv6-first dual-stack cluster: it
// publishes both node IPs and, once it has its pod CIDRs (spec.podCIDRs),
// routes both of its peer's through a VXLAN device over IPv6.
func TestRunDualStack(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		if err := addUplink("10.99.0.2/24,fd99::2/64"); err != nil {
			t.Fatal(err)
		}
		client := fake.NewClientset(
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: self}},
			node("node-b", "fd42:0:0:1::/64,10.42.1.0/24", BackendVXLAN, "10.99.0.3,fd99::3"),
		)
		runBeside(t, client, configOf(BackendVXLAN, "10.99.0.2,fd99::2", "fd42::/56,10.42.0.0/16"), func(ctx context.Context) {
			a := waitPublished(ctx, t, client, func(n *corev1.Node) bool {
				return n.Annotations[AnnotationPublicIP] == "10.99.0.2" && n.Annotations[AnnotationPublicIPv6] == "fd99::2"
			})
			if a == nil {
				return
			}
			a.Spec.PodCIDR, a.Spec.PodCIDRs = "fd42::/64", []string{"fd42::/64", "10.42.0.0/24"}
			if _, err := client.CoreV1().Nodes().Update(ctx, a, metav1.UpdateOptions{}); err != nil {
				t.Error(err)
				return
			}
			mac := vtepMAC("node-b").String()
			want := state{
				Device: fmt.Sprintf("vni 1 port 8472 local fd99::2 parent uplink0 learning false mtu 1430 mac %s up true", vtepMAC(self)),
				Addrs:  []string{"10.42.0.0/32", "fd42::/128"},
				Routes: []string{
					"10.42.1.0/24 via 10.42.1.0 dev kelp.vxlan proto 0x6b onlink",
					"fd42:0:0:1::/64 via fd42:0:0:1:: dev kelp.vxlan proto 0x6b onlink",
				},
				Neighs: []string{"10.42.1.0 lladdr " + mac + " dev kelp.vxlan", "fd42:0:0:1:: lladdr " + mac + " dev kelp.vxlan"},
				FDB:    []string{mac + " dst fd99::3"},
				Table:  "peers4 {10.99.0.3} peers6 {fd99::3}",
			}
			var last state
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				s, err := dump()
				if err != nil {
					t.Error(err)
					return
				}
				if last = s; reflect.DeepEqual(s, want) {
					return
				}
			}
			t.Errorf("never programmed; there is\n%s\nwant\n%s", last, want)
		})
	})
}

// runBeside runs run of client and cfg in this network namespace until
// test returns. Run keeps this thread, so test runs on another, in the
// same namespace, to look at it.
func runBeside(t *testing.T, client *fake.Clientset, cfg Config, test func(ctx context.Context)) {
	fd := testcluster.NetnsFD(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		defer cancel()
		runtime.LockOSThread() // never unlocked: Go retires the thread
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			t.Errorf("setns: %v", err)
			return
		}
		test(ctx)
	}()
	if err := run(ctx, client, informertest.Cache(t, client, TrimNode), cfg, 50*time.Millisecond); err != nil {
		t.Errorf("run: %v", err)
	}
}

// waitPublished waits up to 10 s for this node's Node to be published as
// ok wants it, and returns it; nil, once it has said so, if it never is.
func waitPublished(ctx context.Context, t *testing.T, client *fake.Clientset, ok func(*corev1.Node) bool) *corev1.Node {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n, err := client.CoreV1().Nodes().Get(ctx, self, metav1.GetOptions{})
		if err == nil && ok(n) {
			return n
		}
		if time.Now().After(deadline) {
			t.Errorf("annotations never published: %v, %v", n, err)
			return nil
		}
	}
}

// A node of a cluster with IPv6 pods refuses to start while IPv6 is off,
// and turns it on for the VXLAN device made while it was.
func TestRunIPv6Off(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		const sysctl = "/proc/sys/net/ipv6/conf/default/disable_ipv6"
		if err := inOrder(
			func() error { return addUplink("10.99.0.2/24") },
			func() error { return os.WriteFile(sysctl, []byte("1"), 0o644) },
		); err != nil {
			t.Fatal(err)
		}
		cfg := configOf(BackendVXLAN, "10.99.0.2", "10.42.0.0/16,fd42::/56")
		client := fake.NewClientset()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := run(ctx, client, informertest.Cache(t, client, TrimNode), cfg, time.Second)
		if want := "IPv6 is off on this node (sysctl net.ipv6.conf.default.disable_ipv6=1)"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run with IPv6 off: %v, want %q", err, want)
		}
		if err := os.WriteFile(sysctl, []byte("0"), 0o644); err != nil {
			t.Fatal(err)
		}
		// Past its checks run waits for the informer, which a stopped
		// context ends: one that never lists, so that it has not synced.
		client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
			return true, nil, errors.New("refused")
		})
		ctx, cancel = context.WithCancel(context.Background())
		cancel()
		if err := run(ctx, client, informertest.Cache(t, client, TrimNode), cfg, time.Second); err == nil || !errors.Is(err, context.Canceled) {
			t.Errorf("run with IPv6 on: %v, want it to get as far as the informer", err)
		}
		if data, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + Device + "/disable_ipv6"); err != nil || string(data) != "0\n" {
			t.Errorf("disable_ipv6 of %s: %q, %v; want 0", Device, data, err)
		}
	})
}

// With backend none Run publishes that, and takes away what another
// backend programmed, since the user's CNI routes the same pod CIDRs.
func TestRunNone(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		if err := inOrder(
			func() error { return addUplink("10.99.0.2/24") },
			addLink(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: Device}, VxlanId: vni, Port: vxlanPort}),
			func() error {
				up, err := netlink.LinkByName("uplink0")
				if err != nil {
					return err
				}
				return netlink.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Dst: prefixNet(netip.MustParsePrefix("10.42.1.0/24")),
					Gw: net.ParseIP("10.99.0.3"), Protocol: protocol})
			},
		); err != nil {
			t.Fatal(err)
		}
		a := node(self, "10.42.0.0/24", BackendVXLAN, "10.99.0.2")
		client := fake.NewClientset(a, node("node-b", "10.42.1.0/24", BackendNone, "10.99.0.3"))
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			defer cancel()
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				n, err := client.CoreV1().Nodes().Get(ctx, self, metav1.GetOptions{})
				if err == nil && n.Annotations[AnnotationBackend] == BackendNone {
					if _, ok := n.Annotations[AnnotationVTEPMAC]; ok {
						t.Errorf("annotations %v, want no VTEP MAC", n.Annotations)
					}
					return
				}
			}
			t.Error("backend none never published")
		}()
		if err := run(ctx, client, informertest.Cache(t, client, TrimNode), config(BackendNone), 50*time.Millisecond); err != nil {
			t.Errorf("run: %v", err)
		}
		checkState(t, "after run", state{})
	})
}
