package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kelp-dev/kelp/internal/informer/informertest"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

// lan is two nodes, a and b, on one network: eth0 of each, the ends of a
// veth pair, with 10.7.0.1/24 and fd07::1/64 on a, .2 and ::2 on b.
type lan struct {
	a, b   *testcluster.Netns
	macA   net.HardwareAddr
	record string // a's record of the addresses it holds
}

func newLAN(t *testing.T) *lan {
	t.Helper()
	l := &lan{a: testcluster.NewNetns(t), b: testcluster.NewNetns(t), record: filepath.Join(t.TempDir(), "gateway-addresses.json")}
	b := l.b
	if err := l.a.Do(func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(b.FD)})
	}); err != nil {
		t.Fatal(err)
	}
	for i, n := range []*testcluster.Netns{l.a, l.b} {
		if err := n.Do(func() error {
			link, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			if err := testcluster.AddAddrs(link, fmt.Sprintf("10.7.0.%d/24", i+1), fmt.Sprintf("fd07::%d/64", i+1)); err != nil {
				return err
			}
			if n == l.a {
				l.macA = link.Attrs().HardwareAddr
			}
			return netlink.LinkSetUp(link)
		}); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// addrs are the addresses of eth0 in n.
func addrs(t *testing.T, n *testcluster.Netns) []string {
	t.Helper()
	var got []string
	if err := n.Do(func() error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		got, err = testcluster.AddrsOf(link)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// recorded is what the record file lists, address@interface.
func recorded(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var rec holdRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatalf("record %s: %v", data, err)
	}
	var got []string
	for _, r := range rec.Addresses {
		got = append(got, r.Address+"@"+r.Interface)
	}
	return got
}

// addAddrs adds the addresses (CIDRs) to eth0 in n.
func addAddrs(n *testcluster.Netns, cidrs ...string) error {
	return n.Do(func() error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return testcluster.AddAddrs(link, cidrs...)
	})
}

// A node takes the addresses it is given onto the interface of their
// network, recorded first, and announces them: the other node's
// neighbour entries, which had another MAC, move to it, over IPv4 and
// IPv6. Released, they go from the interface and the record.
func TestHoldAnnounce(t *testing.T) {
	l := newLAN(t)
	x4, x6 := netip.MustParseAddr("10.7.0.100"), netip.MustParseAddr("fd07::100")
	other, _ := net.ParseMAC("02:00:00:00:00:99")
	if err := l.b.Do(func() error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, x := range []netip.Addr{x4, x6} {
			if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: family(x), IP: x.AsSlice(), HardwareAddr: other, State: netlink.NUD_STALE}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	var h *holder
	if err := l.a.Do(func() (err error) {
		h, err = loadHolder(l.record, "n1")
		if err != nil {
			return err
		}
		h.sync(map[netip.Addr]string{x4: "n1", x6: "n1", netip.MustParseAddr("10.7.0.101"): "n2"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := addrs(t, l.a), []string{"10.7.0.1/24", "10.7.0.100/32", "fd07::1/64", "fd07::100/128"}; !slices.Equal(got, want) {
		t.Errorf("a's addresses %v, want %v", got, want)
	}
	if got, want := recorded(t, l.record), []string{"10.7.0.100@eth0", "fd07::100@eth0"}; !slices.Equal(got, want) {
		t.Errorf("recorded %v, want %v", got, want)
	}
	if len(h.problems) > 0 {
		t.Errorf("problems %v", h.problems)
	}
	// Usable at once, and never the source of the node's own connections.
	if err := l.a.Do(func() error {
		list, err := netlink.AddrList(nil, netlink.FAMILY_V6)
		for _, a := range list {
			if ip, _ := netip.AddrFromSlice(a.IP); ip == x6 && a.Flags&(unix.IFA_F_DEPRECATED|unix.IFA_F_TENTATIVE) != unix.IFA_F_DEPRECATED {
				t.Errorf("%s has flags %#x, want deprecated and not tentative", x6, a.Flags)
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}

	macs := func() (map[netip.Addr]string, error) {
		got := map[netip.Addr]string{}
		err := l.b.Do(func() error {
			link, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			neighs, err := netlink.NeighList(link.Attrs().Index, netlink.FAMILY_ALL)
			for _, n := range neighs {
				if a, _ := netip.AddrFromSlice(n.IP); a == x4 || a == x6 {
					got[a] = n.HardwareAddr.String()
				}
			}
			return err
		})
		return got, err
	}
	var got map[netip.Addr]string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		if got, err = macs(); err != nil {
			t.Fatal(err)
		}
		if got[x4] == l.macA.String() && got[x6] == l.macA.String() {
			break
		}
	}
	if got[x4] != l.macA.String() || got[x6] != l.macA.String() {
		t.Errorf("b's neighbours %v, want both at a's MAC %s", got, l.macA)
	}

	if err := l.a.Do(func() error {
		h.sync(map[netip.Addr]string{x4: "n2"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := addrs(t, l.a), []string{"10.7.0.1/24", "fd07::1/64"}; !slices.Equal(got, want) {
		t.Errorf("a's addresses once released %v, want %v", got, want)
	}
	if got := recorded(t, l.record); len(got) > 0 {
		t.Errorf("recorded %v once released, want none", got)
	}
}

// An address on no network of the node's is not added: an error says what
// to do, once. Nor is one something else put on the node, which stays
// when it is no longer given.
func TestHoldRefused(t *testing.T) {
	l := newLAN(t)
	if err := addAddrs(l.a, "10.7.0.200/32"); err != nil {
		t.Fatal(err)
	}
	hook := logtest.NewGlobal()
	defer hook.Reset()
	if err := l.a.Do(func() error {
		h, err := loadHolder(l.record, "n1")
		if err != nil {
			return err
		}
		given := map[netip.Addr]string{netip.MustParseAddr("192.0.2.50"): "n1", netip.MustParseAddr("10.7.0.200"): "n1"}
		h.sync(given)
		h.sync(given)
		h.sync(nil)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var errs []string
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.ErrorLevel {
			errs = append(errs, fmt.Sprint(e.Data[logrus.ErrorKey]))
		}
	}
	slices.Sort(errs)
	want := []string{
		"--gateway-address-range must be on the nodes' network; node n1 has no interface on the network of 192.0.2.50",
		"10.7.0.200/32 is already on interface eth0, and kelp did not put it there: take it off, or take it out of --gateway-address-range",
	}
	if !slices.Equal(errs, want) {
		t.Errorf("errors logged:\n%s\nwant each once:\n%s", strings.Join(errs, "\n"), strings.Join(want, "\n"))
	}
	if got, want := addrs(t, l.a), []string{"10.7.0.1/24", "10.7.0.200/32", "fd07::1/64"}; !slices.Equal(got, want) {
		t.Errorf("a's addresses %v, want %v", got, want)
	}
	if got := recorded(t, l.record); len(got) > 0 {
		t.Errorf("recorded %v, want none", got)
	}
}

// An address another machine on the network has is not added: an ARP
// probe finds an IPv4 one, the kernel's duplicate address detection an
// IPv6 one. The node reports both as in use, and asks again only once
// inUseFor has passed; a free address is added meanwhile.
func TestHoldInUse(t *testing.T) {
	l := newLAN(t)
	// b has them: a machine that is no node, or a node that has not let
	// go yet.
	if err := addAddrs(l.b, "10.7.0.100/32", "fd07::100/128"); err != nil {
		t.Fatal(err)
	}
	x4, x6, free := netip.MustParseAddr("10.7.0.100"), netip.MustParseAddr("fd07::100"), netip.MustParseAddr("10.7.0.101")
	var h *holder
	if err := l.a.Do(func() (err error) {
		if h, err = loadHolder(l.record, "n1"); err != nil {
			return err
		}
		h.sync(map[netip.Addr]string{x4: "n1", x6: "n1", free: "n1"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := addrs(t, l.a), []string{"10.7.0.1/24", "10.7.0.101/32", "fd07::1/64"}; !slices.Equal(got, want) {
		t.Errorf("a's addresses %v, want %v", got, want)
	}
	if got, want := recorded(t, l.record), []string{"10.7.0.101@eth0"}; !slices.Equal(got, want) {
		t.Errorf("recorded %v, want %v", got, want)
	}
	if got, want := h.inUseReport(), "10.7.0.100,fd07::100"; got != want {
		t.Errorf("reported in use %q, want %q", got, want)
	}
	for _, a := range []netip.Addr{x4, x6} {
		if !strings.Contains(h.problems[a], errInUse.Error()) {
			t.Errorf("problem of %s: %q", a, h.problems[a])
		}
	}

	// Freed on the network: a asks again once inUseFor has passed.
	if err := l.b.Do(func() error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return errors.Join(netlink.AddrDel(link, hostAddr(x4)), netlink.AddrDel(link, hostAddr(x6)))
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.a.Do(func() error {
		h.sync(map[netip.Addr]string{x4: "n1", x6: "n1", free: "n1"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := addrs(t, l.a); slices.Contains(got, "10.7.0.100/32") {
		t.Errorf("asked again before inUseFor passed: %v", got)
	}
	if err := l.a.Do(func() error {
		for a, f := range h.inUse {
			f.at = f.at.Add(-inUseFor)
			h.inUse[a] = f
		}
		h.sync(map[netip.Addr]string{x4: "n1", x6: "n1", free: "n1"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := addrs(t, l.a), []string{"10.7.0.1/24", "10.7.0.100/32", "10.7.0.101/32", "fd07::1/64", "fd07::100/128"}; !slices.Equal(got, want) {
		t.Errorf("a's addresses once freed %v, want %v", got, want)
	}
	if got := h.inUseReport(); got != "" {
		t.Errorf("reported in use once freed: %q", got)
	}
}

// A node that held an address before lets go as soon as it reads the
// Config that moves it, which may be after the new holder first asked:
// the address is taken, not found in use.
func TestHoldHandOver(t *testing.T) {
	l := newLAN(t)
	if err := addAddrs(l.b, "10.7.0.100/32", "fd07::100/128"); err != nil {
		t.Fatal(err)
	}
	x4, x6 := netip.MustParseAddr("10.7.0.100"), netip.MustParseAddr("fd07::100")
	let := make(chan error, 1)
	go func() {
		time.Sleep(500 * time.Millisecond)
		let <- l.b.Do(func() error {
			link, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return errors.Join(netlink.AddrDel(link, hostAddr(x4)), netlink.AddrDel(link, hostAddr(x6)))
		})
	}()
	var h *holder
	if err := l.a.Do(func() (err error) {
		if h, err = loadHolder(l.record, "n1"); err != nil {
			return err
		}
		h.sync(map[netip.Addr]string{x4: "n1", x6: "n1"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-let; err != nil {
		t.Fatal(err)
	}
	if got, want := addrs(t, l.a), []string{"10.7.0.1/24", "10.7.0.100/32", "fd07::1/64", "fd07::100/128"}; !slices.Equal(got, want) {
		t.Errorf("a's addresses %v, want %v (problems %v)", got, want, h.problems)
	}
	if got := h.inUseReport(); got != "" {
		t.Errorf("reported in use %q", got)
	}
}

// Serve releases what a crash left recorded, but no address it did not
// record, holds what the config gives its node, and releases all it holds
// when it ends.
func TestServeHoldsAddresses(t *testing.T) {
	l := newLAN(t)
	// Left by a crash: recorded and on eth0, or recorded and gone.
	if err := addAddrs(l.a, "10.7.0.150/32", "10.7.0.200/32"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.record, []byte(`{"addresses":[{"address":"10.7.0.150","interface":"eth0"},{"address":"fd07::150","interface":"eth0"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(Config{Addresses: []HeldAddress{{Address: "10.7.0.100", Node: "n1"}, {Address: "10.7.0.101", Node: "n2"}}})
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: ConfigSecret}, Data: map[string][]byte{ConfigKey: data}},
	)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	informers := informertest.Cache(t, client, nil)
	go func() {
		runtime.LockOSThread() // never unlocked: Go retires the thread
		if err := unix.Setns(l.a.FD, unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		done <- Serve(ctx, client, informers, ServeConfig{NodeName: "n1", AddressesFile: l.record})
	}()
	want := []string{"10.7.0.1/24", "10.7.0.100/32", "10.7.0.200/32", "fd07::1/64"}
	var got []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got = addrs(t, l.a); slices.Equal(got, want) {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("a's addresses while serving %v, want %v", got, want)
	}
	if got, want := recorded(t, l.record), []string{"10.7.0.100@eth0"}; !slices.Equal(got, want) {
		t.Errorf("recorded %v, want %v", got, want)
	}
	// The node says which networks it is on, for the controller.
	var networks string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && networks == ""; time.Sleep(50 * time.Millisecond) {
		n, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		networks = n.Annotations[NetworksAnnotation]
	}
	if networks != "10.7.0.0/24,fd07::/64" {
		t.Errorf("annotation %s %q, want 10.7.0.0/24,fd07::/64", NetworksAnnotation, networks)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if got, want := addrs(t, l.a), []string{"10.7.0.1/24", "10.7.0.200/32", "fd07::1/64"}; !slices.Equal(got, want) {
		t.Errorf("a's addresses once stopped %v, want %v", got, want)
	}
	if got := recorded(t, l.record); len(got) > 0 {
		t.Errorf("recorded %v once stopped, want none", got)
	}
}

// A record that is empty, cut short or not JSON is taken as nothing held.
func TestLoadHolderDamagedRecord(t *testing.T) {
	for _, data := range []string{"", `{"addresses":[{"address":"10.7.0.1`, "\x00\x00\x00"} {
		file := filepath.Join(t.TempDir(), "gateway-addresses.json")
		if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		h, err := loadHolder(file, "n1")
		if err != nil || len(h.held) > 0 {
			t.Errorf("record %q: held %v, %v; want nothing and no error", data, h.held, err)
		}
	}
	h, err := loadHolder(filepath.Join(t.TempDir(), "none.json"), "n1")
	if err != nil || len(h.held) > 0 {
		t.Errorf("no record: held %v, %v; want nothing and no error", h.held, err)
	}
}

// A node says the networks of its interfaces, not the host addresses it
// holds for Gateways nor link-local ones.
func TestNetworks(t *testing.T) {
	l := newLAN(t)
	if err := addAddrs(l.a, "10.7.0.200/32", "fd07::c8/128", "192.168.9.1/16"); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := l.a.Do(func() error {
		got = networks()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := "10.7.0.0/24,192.168.0.0/16,fd07::/64"; got != want {
		t.Errorf("networks %q, want %q", got, want)
	}
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}
