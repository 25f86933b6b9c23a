package loadbalancer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// dialTimeout bounds the try of one server; the next is tried after it.
const dialTimeout = 3 * time.Second

var log = logrus.WithField("component", "loadbalancer")

// LB is a running load balancer.
type LB struct {
	listener net.Listener

	mu      sync.Mutex
	servers []string // host:port, the one that answered last first
}

// Start listens on addr (e.g. 127.0.0.1:6444) and forwards to servers
// (host:port) until ctx ends.
func Start(ctx context.Context, addr string, servers []string) (*LB, error) {
	if len(servers) == 0 {
		return nil, errors.New("loadbalancer: no server to forward to")
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("loadbalancer: listen on %s (is another kelp agent running?): %w", addr, err)
	}
	lb := &LB{listener: l, servers: slices.Clone(servers)}
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	go lb.serve()
	return lb, nil
}

// Addr is where the load balancer listens.
func (lb *LB) Addr() string {
	return lb.listener.Addr().String()
}

// SetServers replaces the servers; connections already made stay.
func (lb *LB) SetServers(servers []string) {
	if len(servers) == 0 {
		return
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.servers = slices.Clone(servers)
}

func (lb *LB) serve() {
	for {
		conn, err := lb.listener.Accept()
		if err != nil {
			return // closed
		}
		go lb.forward(conn)
	}
}

// forward connects conn to the first server that answers, starting with
// the one that answered last.
func (lb *LB) forward(conn net.Conn) {
	defer conn.Close()
	lb.mu.Lock()
	servers := slices.Clone(lb.servers)
	lb.mu.Unlock()
	var upstream net.Conn
	var errs []error
	for _, s := range servers {
		c, err := net.DialTimeout("tcp", s, dialTimeout)
		if err == nil {
			upstream = c
			lb.preferred(s)
			break
		}
		errs = append(errs, err)
	}
	if upstream == nil {
		log.WithError(errors.Join(errs...)).Debug("no server answers")
		return
	}
	defer upstream.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tcp, ok := dst.(*net.TCPConn); ok {
			_ = tcp.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(upstream, conn)
	go pipe(conn, upstream)
	<-done
	<-done
}

// preferred moves server to the front, so that the next connection tries
// it first.
func (lb *LB) preferred(server string) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if i := slices.Index(lb.servers, server); i > 0 {
		lb.servers = append([]string{server}, slices.Delete(lb.servers, i, i+1)...)
		log.WithField("server", server).Info("apiserver connections go to another server")
	}
}
