package testcluster

import (
	"net/netip"
	"strconv"
	"testing"

	"github.com/kelp-dev/kelp/internal/machine"
)

// labBridge links the nodes of a Lab. It has no address: as for a node
// made by NewNode, nothing answers at the nodes' default gateway
// 10.99.0.1.
const labBridge = "lab0"

// labNet is the network of the nodes of a Lab; labNet6 is its IPv6
// network, for nodes made by NewDualStackNode.
var (
	labNet  = netip.MustParsePrefix("10.99.0.0/24")
	labNet6 = netip.MustParsePrefix("fd99::/64")
)

// Lab is a network of several kelp nodes on one machine: a
// machine.Network with a bridge the nodes are wired to. Its nodes are made
// as by NewNode, each with its own cgroup subtree, but wired to the lab's
// bridge.
type Lab struct {
	t       *testing.T
	network *machine.Network
	nodes   []*Node
}

// NewLab makes an empty lab; it goes away with the test, after its nodes.
func NewLab(t *testing.T) *Lab {
	t.Helper()
	NeedRoot(t)
	network, err := machine.NewNetwork(labBridge, nil, Spawn)
	if err != nil {
		t.Fatalf("set up lab namespace: %v", err)
	}
	t.Cleanup(func() {
		if err := network.Remove(); err != nil {
			t.Error(err)
		}
	})
	return &Lab{t: t, network: network}
}

// NewNode makes a node of the lab named name with address ip in
// 10.99.0.0/24 (not .1, the gateway that answers nothing): network, mount
// and cgroup namespaces, eth0 with ip on the lab bridge and a default route
// via 10.99.0.1, private mounts over privateDirs and the node's own view
// of the cgroups. It goes away with the test, before the lab.
func (l *Lab) NewNode(name, ip string) *Node {
	t := l.t
	t.Helper()
	for _, other := range l.nodes {
		if other.Name == name {
			t.Fatalf("node %s: the lab has a node of that name", name)
		}
	}
	addr := l.freeAddress(ip)
	n := newNode(t, name, ip)
	l.nodes = append(l.nodes, n)
	n.makeMachine()
	if err := l.network.Wire(n.machine, "veth"+strconv.Itoa(len(l.nodes)), netip.PrefixFrom(addr, labNet.Bits()), labNet.Addr().Next()); err != nil {
		t.Fatal(err)
	}
	return n
}

// freeAddress is ip, a node's new address: a host address of
// 10.99.0.0/24 other than the gateway's that no node has.
func (l *Lab) freeAddress(ip string) netip.Addr {
	t := l.t
	t.Helper()
	addr, err := netip.ParseAddr(ip)
	if err != nil || !labNet.Contains(addr) || addr == labNet.Addr() || addr == labNet.Addr().Next() || addr.As4()[3] == 255 {
		t.Fatalf("node address %q: want a host address of %s other than 10.99.0.1", ip, labNet)
	}
	for _, other := range l.nodes {
		if other.IP == ip {
			t.Fatalf("address %s: the lab's node %s has it", ip, other.Name)
		}
	}
	return addr
}

// Readdress gives node n of the lab the address ip in place of its own,
// as a DHCP lease or a move to another port does to a machine: eth0 loses
// the old address, and with it the default route, and gets ip and the
// route back. n.IP is ip from then on.
func (l *Lab) Readdress(n *Node, ip string) {
	t := l.t
	t.Helper()
	addr := l.freeAddress(ip)
	old := netip.PrefixFrom(netip.MustParseAddr(n.IP), labNet.Bits())
	for _, args := range [][]string{
		{"addr", "del", old.String(), "dev", "eth0"},
		{"addr", "add", netip.PrefixFrom(addr, labNet.Bits()).String(), "dev", "eth0"},
		{"route", "replace", "default", "via", labNet.Addr().Next().String(), "dev", "eth0"},
	} {
		if out, err := n.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("node %s: ip %v: %v\n%s", n.Name, args, err, out)
		}
	}
	n.IP = ip
}

// NewDualStackNode makes a node of the lab as NewNode does, with an IPv6
// address ip6 in fd99::/64 besides ip (not fd99::1, the gateway that
// answers nothing) and a default IPv6 route via fd99::1. Its kelp gets
// both addresses as --node-ip.
func (l *Lab) NewDualStackNode(name, ip, ip6 string) *Node {
	t := l.t
	t.Helper()
	addr, err := netip.ParseAddr(ip6)
	if err != nil || !addr.Is6() || !labNet6.Contains(addr) || addr == labNet6.Addr() || addr == labNet6.Addr().Next() {
		t.Fatalf("node IPv6 address %q: want a host address of %s other than fd99::1", ip6, labNet6)
	}
	for _, other := range l.nodes {
		if other.IP6 == ip6 {
			t.Fatalf("node %s %s: the lab has node %s %s", name, ip6, other.Name, other.IP6)
		}
	}
	n := l.NewNode(name, ip)
	n.IP6 = ip6
	for _, args := range [][]string{
		// nodad: the address is usable at once, not tentative for a
		// second while the kernel looks for a duplicate no lab has.
		{"-6", "addr", "add", netip.PrefixFrom(addr, labNet6.Bits()).String(), "dev", "eth0", "nodad"},
		{"-6", "route", "add", "default", "via", labNet6.Addr().Next().String(), "dev", "eth0"},
	} {
		if out, err := n.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("node %s: ip %v: %v\n%s", name, args, err, out)
		}
	}
	return n
}
