package machine

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
)

// Network links machines by a bridge in a network namespace of its own,
// held open by a sleeping process: the bridge never sees the host's
// firewall, and nothing of it is in the host's namespace.
type Network struct {
	Holder Process `json:"holder"`
	Bridge string  `json:"bridge"`
}

// NewNetwork makes a network whose bridge is named bridge, with its holder
// started by start, in cgroups if not nil. It lives as long as its holder,
// or until Remove.
func NewNetwork(bridge string, cgroups *Cgroups, start func(*exec.Cmd) error) (*Network, error) {
	holder, err := HoldNetns(cgroups, start,
		"ip link add "+bridge+" type bridge",
		"ip link set "+bridge+" up",
		// The network is wire, not a firewall: kelp turns on
		// bridge-nf-call-iptables in its nodes (the setting is per network
		// namespace), and this bridge must pass what the nodes send each
		// other, their VXLAN overlay too, without consulting netfilter.
		"if [ -d /proc/sys/net/bridge ]; then for f in iptables ip6tables arptables; do echo 0 > /proc/sys/net/bridge/bridge-nf-call-$f; done; fi",
	)
	if err != nil {
		return nil, err
	}
	return &Network{Holder: holder, Bridge: bridge}, nil
}

// HoldNetns starts, with start and in cgroups if not nil, a process that
// holds a new network namespace open, with loopback up and set up by the
// shell commands setup. Killing it removes the namespace.
func HoldNetns(cgroups *Cgroups, start func(*exec.Cmd) error, setup ...string) (Process, error) {
	args := []string{"unshare", "--net", "sh", "-c", holderScript(append([]string{"ip link set lo up"}, setup...))}
	holder := exec.Command(args[0], args[1:]...)
	if cgroups != nil {
		holder = cgroups.Join(args...)
	}
	if err := startHolder(holder, start); err != nil {
		return Process{}, fmt.Errorf("set up network namespace: %w", err)
	}
	p, err := ProcessOf(holder.Process.Pid)
	if err != nil {
		_ = holder.Process.Kill()
		return Process{}, err
	}
	return p, nil
}

// Wire links m to the bridge by a veth pair whose end in m is named eth0,
// with address addr and a default route via gateway. The pair is made in
// the network and its far end moved to m: neither end is ever in the
// host's namespace. link names the network's end; unique in the network.
func (n *Network) Wire(m *Machine, link string, addr netip.Prefix, gateway netip.Addr) error {
	for _, cmd := range []*exec.Cmd{
		n.Command("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", strconv.Itoa(m.Holder.Pid)),
		n.Command("ip", "link", "set", link, "master", n.Bridge, "up"),
		m.Command("ip", "addr", "add", addr.String(), "dev", "eth0"),
		m.Command("ip", "link", "set", "eth0", "up"),
		m.Command("ip", "route", "add", "default", "via", gateway.String(), "dev", "eth0"),
	} {
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("wire machine %s: %v: %v\n%s", m.Name, cmd.Args, err, out)
		}
	}
	return nil
}

// AddAddress gives the bridge an address in the network's namespace, so
// that what runs there, or dials from there (InNetnsOf), reaches the
// machines: for machines whose default gateway it is.
func (n *Network) AddAddress(addr netip.Prefix) error {
	if out, err := n.Command("ip", "addr", "add", addr.String(), "dev", n.Bridge).CombinedOutput(); err != nil {
		return fmt.Errorf("address the network's bridge: %v\n%s", err, out)
	}
	return nil
}

// Command returns cmd to run in the network's namespace.
func (n *Network) Command(name string, args ...string) *exec.Cmd {
	return exec.Command(nsenterPath(), append([]string{"--target", strconv.Itoa(n.Holder.Pid), "--net", "--", name}, args...)...)
}

// Alive says whether the network's holder still runs.
func (n *Network) Alive() bool { return n.Holder.Alive() }

// Remove kills the network's holder: the namespace, its bridge and every
// veth pair wired to it go with it.
func (n *Network) Remove() error {
	return n.Holder.Kill()
}
