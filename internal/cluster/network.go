package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"

	"github.com/kelp-dev/kelp/internal/machine"
)

// subnets is where clusters' node networks come from, a /24 each: away
// from kelp's pod and service networks (10.42/16, 10.43/16) and from the
// 10.0–10.99 and 192.168 ranges home and cloud networks favour.
var subnets = netip.MustParsePrefix("10.100.0.0/16")

// chooseSubnet picks the first /24 of subnets that no other cluster under
// root has and that overlaps no route or address of this host.
func chooseSubnet(root string) (netip.Prefix, error) {
	taken, err := hostPrefixes()
	if err != nil {
		return netip.Prefix{}, err
	}
	others, err := list(root)
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, s := range others {
		taken = append(taken, s.Subnet)
	}
	return freeSubnet(taken)
}

// freeSubnet is the first /24 of subnets that overlaps none of taken.
func freeSubnet(taken []netip.Prefix) (netip.Prefix, error) {
	base := subnets.Addr().As4()
	for i := 0; i < 256; i++ {
		candidate := netip.PrefixFrom(netip.AddrFrom4([4]byte{base[0], base[1], byte(i), 0}), 24)
		free := true
		for _, t := range taken {
			// A default route overlaps everything and says nothing.
			if t.IsValid() && t.Bits() > 0 && t.Overlaps(candidate) {
				free = false
				break
			}
		}
		if free {
			return candidate, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no /24 of %s is free of this host's routes and other clusters: delete a cluster", subnets)
}

// hostPrefixes are the IPv4 networks of this host's routes and addresses.
func hostPrefixes() ([]netip.Prefix, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list this host's routes: %w", err)
	}
	var out []netip.Prefix
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if p, err := netip.ParsePrefix(r.Dst.String()); err == nil {
			out = append(out, p.Masked())
		}
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list this host's addresses: %w", err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.IPNet.String()); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out, nil
}

// ParsePort reads a --port HOST:NODEPORT.
func ParsePort(s string) (Port, error) {
	host, node, ok := strings.Cut(s, ":")
	h, err1 := strconv.ParseUint(host, 10, 16)
	n, err2 := strconv.ParseUint(node, 10, 16)
	if !ok || err1 != nil || err2 != nil || h == 0 || n == 0 {
		return Port{}, fmt.Errorf("--port %q: give HOST:NODEPORT, such as 8080:30080 (the host's loopback port, then a NodePort of the cluster)", s)
	}
	return Port{Host: uint16(h), Node: uint16(n)}, nil
}

// checkPortFree says whether the host's loopback port is taken.
func checkPortFree(port uint16) error {
	l, err := net.Listen("tcp", hostAddr(port))
	if err != nil {
		return fmt.Errorf("--port: port %d of the host's loopback is in use (%v): choose another host port", port, err)
	}
	return l.Close()
}

func hostAddr(port uint16) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
}

// startForwarder starts `kelp cluster forward` in a session of its own on
// the host, publishing the cluster's ports on the host's loopback.
func startForwarder(s *State) (machine.Process, error) {
	args := []string{"cluster", "forward"}
	for _, p := range s.Ports {
		args = append(args, hostAddr(p.Host)+"="+net.JoinHostPort(s.Nodes[0].IP.String(), strconv.Itoa(int(p.Node))))
	}
	cmd := exec.Command(s.Binary, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return machine.Process{}, err
	}
	if err := machine.Detached(cmd); err != nil {
		return machine.Process{}, fmt.Errorf("start the port forwarder: %w", err)
	}
	// It says "ready" once it listens on every port.
	line := make([]byte, 6)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return machine.Process{}, fmt.Errorf("the port forwarder: %s", strings.TrimSpace(stderr.String()))
	}
	go func() { _ = cmd.Wait() }()
	return machine.ProcessOf(cmd.Process.Pid)
}

// Forward listens on every LISTEN of pairs "LISTEN=TARGET" and copies each
// connection to a new one to its TARGET, until ctx ends. It writes
// "ready\n" to ready once it listens on all.
func Forward(ctx context.Context, pairs []string, ready io.Writer) error {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	targets := map[net.Listener]string{}
	for _, p := range pairs {
		listen, target, ok := strings.Cut(p, "=")
		if !ok {
			return fmt.Errorf("%q: want LISTEN=TARGET", p)
		}
		l, err := net.Listen("tcp", listen)
		if err != nil {
			return err
		}
		listeners = append(listeners, l)
		targets[l] = target
	}
	fmt.Fprint(ready, "ready\n")
	if f, ok := ready.(*os.File); ok {
		f.Close() // whoever waited for it does not read further
	}
	var wg sync.WaitGroup
	for _, l := range listeners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve(l, targets[l])
		}()
	}
	<-ctx.Done()
	for _, l := range listeners {
		l.Close()
	}
	wg.Wait()
	return nil
}

func serve(l net.Listener, target string) {
	for {
		conn, err := l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				logrus.WithField("component", "cluster-forward").Warnf("accept on %s: %v", l.Addr(), err)
			}
			return
		}
		go proxy(conn, target)
	}
}

// proxy copies between conn and a new connection to target, each way
// until its end closes, then closes both.
func proxy(conn net.Conn, target string) {
	defer conn.Close()
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, conn); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(conn, up); closeWrite(conn); done <- struct{}{} }()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}
