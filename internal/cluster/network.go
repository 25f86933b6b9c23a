package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/machine"
)

// nodeNet is the network of every cluster's nodes, each cluster in a
// network namespace of its own, with the gateway .1 on its bridge there:
// the host reaches a cluster only through its forwarder, so clusters never
// clash with each other or with the host's routes, and a cluster made from
// a saved one keeps its nodes' addresses.
var nodeNet = netip.MustParsePrefix("10.100.0.0/24")

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
		return fmt.Errorf("port %d of the host's loopback is in use (%v): choose another host port", port, err)
	}
	return l.Close()
}

// freePort is a port of the host's loopback that no one listens on now.
func freePort() (uint16, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port), nil
}

func hostAddr(port uint16) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
}

// startForwarder starts `kelp cluster forward` in a session of its own on
// the host, in the cluster's cgroups: it publishes the cluster's API (on APIPort, to its servers in
// turn) and ports on the host's loopback, and dials the nodes from the
// cluster's network namespace.
func startForwarder(s *State, cgroups *machine.Cgroups) (machine.Process, error) {
	var servers []string
	for _, n := range s.Nodes {
		if n.Role == "server" {
			servers = append(servers, net.JoinHostPort(n.IP.String(), "6443"))
		}
	}
	args := []string{"cluster", "forward", strconv.Itoa(s.Network.Holder.Pid), hostAddr(s.APIPort) + "=" + strings.Join(servers, ",")}
	for _, p := range s.Ports {
		args = append(args, hostAddr(p.Host)+"="+net.JoinHostPort(s.Nodes[0].IP.String(), strconv.Itoa(int(p.Node))))
	}
	cmd := cgroups.Join(append([]string{s.Binary}, args...)...)
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
		return machine.Process{}, fmt.Errorf("publish the cluster's ports: %s", strings.TrimSpace(stderr.String()))
	}
	go func() { _ = cmd.Wait() }()
	return machine.ProcessOf(cmd.Process.Pid)
}

// Forward listens on the host's side of every pair "LISTEN=TARGET[,TARGET…]"
// and copies each connection to a new one to the first TARGET that
// answers, dialled from the network namespace of process netnsPid, until
// ctx ends. It writes "ready\n" to ready once it listens on all.
func Forward(ctx context.Context, netnsPid int, pairs []string, ready io.Writer) error {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	targets := map[net.Listener][]string{}
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
		targets[l] = strings.Split(target, ",")
	}
	fmt.Fprint(ready, "ready\n")
	if f, ok := ready.(*os.File); ok {
		f.Close() // whoever waited for it reads no further
	}
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		var conn net.Conn
		err := machine.InNetnsOf(netnsPid, func() error {
			var err error
			conn, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr)
			return err
		})
		return conn, err
	}
	var wg sync.WaitGroup
	for _, l := range listeners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve(ctx, l, targets[l], dial)
		}()
	}
	<-ctx.Done()
	for _, l := range listeners {
		l.Close()
	}
	wg.Wait()
	return nil
}

func serve(ctx context.Context, l net.Listener, targets []string, dial func(context.Context, string) (net.Conn, error)) {
	for {
		conn, err := l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				logrus.WithField("component", "cluster-forward").Warnf("accept on %s: %v", l.Addr(), err)
			}
			return
		}
		go func() {
			defer conn.Close()
			for _, t := range targets {
				if up, err := dial(ctx, t); err == nil {
					proxy(conn, up)
					return
				}
			}
		}()
	}
}

// proxy copies between conn and up, each way until its end closes.
func proxy(conn, up net.Conn) {
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
