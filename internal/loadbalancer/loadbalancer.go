package loadbalancer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kelp-dev/kelp/internal/notify"
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

// Follow keeps the servers in step with the apiservers the cluster
// publishes (the kubernetes Service's endpoints) until ctx ends, so that
// servers added after the node joined are known too; fallback (the
// address the node joined through) stays last.
func (lb *LB) Follow(ctx context.Context, client kubernetes.Interface, fallback []string) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(metav1.NamespaceDefault),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=kubernetes"
		}))
	endpoints := factory.Discovery().V1().EndpointSlices()
	changed := notify.New()
	if _, err := endpoints.Informer().AddEventHandler(changed.Handler()); err != nil {
		log.WithError(err).Warn("cannot follow the apiservers")
		return
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed.C():
		}
		list, err := endpoints.Lister().List(labels.Everything())
		if err != nil {
			continue
		}
		servers := Servers(list)
		for _, f := range fallback {
			if !slices.Contains(servers, f) {
				servers = append(servers, f)
			}
		}
		lb.SetServers(servers)
	}
}

// Servers lists the host:port of the ready apiserver endpoints in slices.
func Servers(eps []*discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range eps {
		for _, p := range s.Ports {
			if p.Port == nil || ptr.Deref(p.Name, "") != "https" {
				continue
			}
			for _, e := range s.Endpoints {
				if !ptr.Deref(e.Conditions.Ready, true) {
					continue
				}
				for _, a := range e.Addresses {
					out = append(out, net.JoinHostPort(a, strconv.Itoa(int(*p.Port))))
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
