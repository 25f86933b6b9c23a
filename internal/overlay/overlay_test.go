package overlay

import (
	"context"
	"fmt"
	"net"
	"net/netip"
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
	"k8s.io/client-go/kubernetes/fake"

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
		{change: func(c *Config) { c.NodeIP = netip.Addr{} }, err: "node IP invalid IP"},
		{change: func(c *Config) { c.NodeIP = netip.MustParseAddr("fd00::2") }, err: "only IPv4 node IPs"},
		{change: func(c *Config) { c.ClusterCIDR = netip.Prefix{} }, err: "cluster CIDR invalid Prefix"},
		{change: func(c *Config) { c.ClusterCIDR = netip.MustParsePrefix("fd00:42::/56") }, err: "only IPv4 cluster networks"},
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
	n := node("node-b", "10.42.1.0/24", BackendVXLAN, "10.99.0.3")
	n.Annotations["big"] = "yes"
	n.Labels = map[string]string{"kubernetes.io/hostname": "node-b"}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"pause"}}}
	got, err := trimNode(n)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := got.(*corev1.Node)
	if trimmed.Annotations["big"] != "" || trimmed.Labels != nil || trimmed.Status.Images != nil {
		t.Errorf("not trimmed: %+v", trimmed)
	}
	want := Peers([]*corev1.Node{n}, config(BackendVXLAN))
	if got := Peers([]*corev1.Node{trimmed}, config(BackendVXLAN)); len(want) != 1 || !reflect.DeepEqual(got, want) {
		t.Errorf("trimmed too much: Peers %+v, want %+v", got, want)
	}
	if got, _ := trimNode(&corev1.Pod{}); got == nil {
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
	for i, backend := range []string{BackendHostGW, BackendVXLAN, BackendVXLAN} {
		n, err := client.CoreV1().Nodes().Get(ctx, self, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before := len(client.Actions())
		if err := publish(ctx, client, n, config(backend)); err != nil {
			t.Fatal(err)
		}
		if patched, wantPatch := len(client.Actions()) > before, i < 2; patched != wantPatch {
			t.Errorf("%d: %s: patched %v, want %v", i, backend, patched, wantPatch)
		}
		n, err = client.CoreV1().Nodes().Get(ctx, self, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{AnnotationBackend: backend, AnnotationPublicIP: "10.99.0.2", "other": "kept"}
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
		fd := testcluster.NetnsFD(t)
		b := node("node-b", "10.42.1.0/24", BackendVXLAN, "10.99.0.3")
		client := fake.NewClientset(
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: self}},
			b,
			node("node-c", "10.42.2.0/24", BackendHostGW, "10.99.0.4"),
		)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Run keeps this thread; the test looks at the namespace from
		// another.
		go func() {
			defer cancel()
			runtime.LockOSThread() // never unlocked: Go retires the thread
			if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
				t.Errorf("setns: %v", err)
				return
			}
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

			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				n, err := client.CoreV1().Nodes().Get(ctx, self, metav1.GetOptions{})
				if err == nil && n.Annotations[AnnotationVTEPMAC] == vtepMAC(self).String() {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("annotations never published: %v, %v", n, err)
					return
				}
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
		}()
		cfg := config(BackendVXLAN)
		if err := run(ctx, client, cfg, 50*time.Millisecond); err != nil {
			t.Errorf("run: %v", err)
		}
		// The overlay stays while kelp is stopped or restarts.
		if s, err := dump(); err != nil || s.Device == "" || s.Addrs == nil {
			t.Errorf("after run:\n%s\n%v\nwant the device kept", s, err)
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
		if err := run(ctx, client, config(BackendNone), 50*time.Millisecond); err != nil {
			t.Errorf("run: %v", err)
		}
		checkState(t, "after run", state{})
	})
}
