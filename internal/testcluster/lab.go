package testcluster

import (
	"net/netip"
	"os/exec"
	"strconv"
	"testing"
)

// labBridge links the nodes of a Lab. It has no address: as for a node
// made by NewNode, nothing answers at the nodes' default gateway
// 10.99.0.1.
const labBridge = "lab0"

// labNet is the network of the nodes of a Lab.
var labNet = netip.MustParsePrefix("10.99.0.0/24")

// Lab is a network of several kelp nodes on one machine: a network
// namespace, held open by a sleeping process, with a bridge the nodes are
// wired to. Its nodes are made as by NewNode, each with its own cgroup
// subtree, but wired to the lab's bridge.
type Lab struct {
	t      *testing.T
	holder *exec.Cmd
	nodes  []*Node
}

// NewLab makes an empty lab; it goes away with the test, after its nodes.
func NewLab(t *testing.T) *Lab {
	t.Helper()
	NeedRoot(t)
	l := &Lab{t: t, holder: exec.Command("unshare", "--net", "sh", "-c", holderScript([]string{
		"ip link set lo up",
		"ip link add " + labBridge + " type bridge",
		"ip link set " + labBridge + " up",
		// The lab is wire, not a firewall: kelp turns on
		// bridge-nf-call-iptables in its nodes (the setting is per network
		// namespace), and this bridge must pass what the nodes send each
		// other, their VXLAN overlay too, without consulting netfilter.
		"echo 0 > /proc/sys/net/bridge/bridge-nf-call-iptables",
		"echo 0 > /proc/sys/net/bridge/bridge-nf-call-ip6tables",
		"echo 0 > /proc/sys/net/bridge/bridge-nf-call-arptables",
	}))}
	t.Cleanup(func() {
		if l.holder.Process != nil && l.holder.ProcessState == nil {
			_ = l.holder.Process.Kill()
			_ = l.holder.Wait()
		}
	})
	if err := startHolder(l.holder); err != nil {
		t.Fatalf("set up lab namespace: %v", err)
	}
	return l
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
	n.makeNamespaces()

	// The veth pair is made in the lab and its far end moved to the node:
	// neither end is ever in the machine's own namespace.
	labEnd := "veth" + strconv.Itoa(len(l.nodes))
	nodePid := strconv.Itoa(n.holder.Process.Pid)
	for _, cmd := range []*exec.Cmd{
		l.command("ip", "link", "add", labEnd, "type", "veth", "peer", "name", "eth0", "netns", nodePid),
		l.command("ip", "link", "set", labEnd, "master", labBridge, "up"),
		n.Command("ip", "addr", "add", ip+"/24", "dev", "eth0"),
		n.Command("ip", "link", "set", "eth0", "up"),
		n.Command("ip", "route", "add", "default", "via", labNet.Addr().Next().String(), "dev", "eth0"),
	} {
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("wire node %s: %v: %v\n%s", name, cmd.Args, err, out)
		}
	}
	return n
}

// command returns cmd to run in the lab's network namespace.
func (l *Lab) command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--target", strconv.Itoa(l.holder.Process.Pid), "--net", "--", name}, args...)...)
}
