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

// labNet is the network of the nodes of a Lab.
var labNet = netip.MustParsePrefix("10.99.0.0/24")

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
	addr, err := netip.ParseAddr(ip)
	if err != nil || !labNet.Contains(addr) || addr == labNet.Addr() || addr == labNet.Addr().Next() || addr.As4()[3] == 255 {
		t.Fatalf("node address %q: want a host address of %s other than 10.99.0.1", ip, labNet)
	}
	for _, other := range l.nodes {
		if other.Name == name || other.IP == ip {
			t.Fatalf("node %s %s: the lab has node %s %s", name, ip, other.Name, other.IP)
		}
	}
	n := newNode(t, name, ip)
	l.nodes = append(l.nodes, n)
	n.makeMachine()
	if err := l.network.Wire(n.machine, "veth"+strconv.Itoa(len(l.nodes)), netip.PrefixFrom(addr, labNet.Bits()), labNet.Addr().Next()); err != nil {
		t.Fatal(err)
	}
	return n
}
