package proxy

import (
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// inNewNetns runs fn on a thread in a network namespace of its own, so the
// test never touches the machine's nftables. The thread is discarded after.
func inNewNetns(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: Go retires the thread
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare: %v", err)
			return
		}
		fn()
	}()
	<-done
}

func TestApplyProgramsTheKernel(t *testing.T) {
	inNewNetns(t, func() {
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		ports := []Port{
			{ClusterIP: netip.MustParseAddr("10.43.0.1"), Protocol: unix.IPPROTO_TCP, Port: 443,
				Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.99.0.2:6443")}},
			{ClusterIP: netip.MustParseAddr("10.43.0.20"), Protocol: unix.IPPROTO_UDP, Port: 53, NodePort: 30053,
				ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.7")},
				Endpoints:   []netip.AddrPort{netip.MustParseAddrPort("10.42.0.5:5353"), netip.MustParseAddrPort("10.42.0.6:5353")}},
			{ClusterIP: netip.MustParseAddr("10.43.0.30"), Protocol: unix.IPPROTO_TCP, Port: 80},
			// A hostPort, and one that collides with a NodePort: the Service wins.
			{Protocol: unix.IPPROTO_TCP, NodePort: 8443, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.42.0.7:443")}},
			{Protocol: unix.IPPROTO_UDP, NodePort: 30053, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("10.42.0.8:53")}},
		}
		cidr := netip.MustParsePrefix("10.42.0.0/16")
		for range 2 { // the second apply replaces the first
			if err := Apply(c, cidr, ports); err != nil {
				t.Fatal(err)
			}
		}
		tables, err := c.ListTables()
		if err != nil || len(tables) != 1 || tables[0].Name != Table {
			t.Fatalf("tables %v, %v", tables, err)
		}
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
		if err != nil {
			t.Fatal(err)
		}
		// services, prerouting, output, postrouting, three filter chains;
		// a chain per Service port with endpoints and per endpoint.
		if got, want := len(chains), 7+4+5; got != want {
			t.Errorf("%d chains, want %d", got, want)
		}
		set, err := c.GetSetByName(tables[0], "service-ips")
		if err != nil {
			t.Fatal(err)
		}
		elems, err := c.GetSetElements(set)
		if err != nil || len(elems) != 3 {
			t.Errorf("service-ips holds %d elements (%v), want 3 (two ClusterIPs, an external IP)", len(elems), err)
		}
		set, err = c.GetSetByName(tables[0], "no-endpoints")
		if err != nil {
			t.Fatal(err)
		}
		if elems, err := c.GetSetElements(set); err != nil || len(elems) != 1 {
			t.Errorf("no-endpoints holds %d elements (%v), want 1", len(elems), err)
		}
		set, err = c.GetSetByName(tables[0], "service-nodeports")
		if err != nil {
			t.Fatal(err)
		}
		if elems, err := c.GetSetElements(set); err != nil || len(elems) != 2 {
			t.Errorf("service-nodeports holds %d elements (%v), want 2 (a NodePort, a hostPort)", len(elems), err)
		}
	})
}
