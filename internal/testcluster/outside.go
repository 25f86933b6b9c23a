package testcluster

import (
	"context"
	"net"
	"os/exec"
	"strconv"

	"github.com/kelp-dev/kelp/internal/machine"
)

// Addresses of the link between a node and its Outside.
const (
	OutsideIP     = "10.98.0.2"
	NodeOutsideIP = "10.98.0.1"
)

// Outside is a network namespace wired to a node by a veth pair, with no
// route to the pod network: a stand-in for the world beyond the cluster.
// Pods reach it only if the node masquerades their traffic.
type Outside struct {
	holder machine.Process
}

// NewOutside makes the Outside of n; it goes away with the test.
func (n *Node) NewOutside() *Outside {
	n.t.Helper()
	holder, err := machine.HoldNetns(nil, Spawn)
	if err != nil {
		n.t.Fatalf("set up outside namespace: %v", err)
	}
	n.t.Cleanup(func() {
		if err := holder.Kill(); err != nil {
			n.t.Error(err)
		}
	})
	o := &Outside{holder: holder}
	pid := strconv.Itoa(holder.Pid)
	for _, cmd := range []*exec.Cmd{
		n.Command("ip", "link", "add", "kelp-out", "type", "veth", "peer", "name", "eth0", "netns", pid),
		n.Command("ip", "addr", "add", NodeOutsideIP+"/24", "dev", "kelp-out"),
		n.Command("ip", "link", "set", "kelp-out", "up"),
		exec.Command("nsenter", "--target", pid, "--net", "ip", "addr", "add", OutsideIP+"/24", "dev", "eth0"),
		exec.Command("nsenter", "--target", pid, "--net", "ip", "link", "set", "eth0", "up"),
	} {
		if out, err := cmd.CombinedOutput(); err != nil {
			n.t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
		}
	}
	return o
}

// Listen opens a listener inside the Outside namespace.
func (o *Outside) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := machine.InNetnsOf(o.holder.Pid, func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// DialContext opens a connection from inside the Outside namespace.
func (o *Outside) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := machine.InNetnsOf(o.holder.Pid, func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}
