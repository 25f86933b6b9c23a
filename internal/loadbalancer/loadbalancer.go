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
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/reconcile"
)

// kubernetesService names the Service of the apiservers. The apiserver
// publishes its addresses in an EndpointSlice of the same name in
// default, labelled with the service name and with no managed-by label
// (k8s.io/kubernetes/pkg/controlplane/reconcilers, EndpointsAdapter); it
// marks the Service's Endpoints skip-mirror, so no controller makes
// another slice for it.
const kubernetesService = "kubernetes"

// dialTimeout bounds the try of one server; the next is tried after it.
const dialTimeout = 3 * time.Second

var log = logrus.WithField("component", "loadbalancer")

var _ component.Component = (*LB)(nil)

// LB is a running load balancer.
type LB struct {
	listener net.Listener
	ready    chan struct{}
	stopOnce sync.Once

	mu      sync.Mutex
	servers []string // host:port, the one that answered last first
}

// Start listens on addr (e.g. 127.0.0.1:6444) and forwards to servers
// (host:port) until Stop.
func Start(addr string, servers []string) (*LB, error) {
	if len(servers) == 0 {
		return nil, errors.New("no apiserver to forward to")
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (is another kelp agent running?): %w", addr, err)
	}
	lb := &LB{listener: l, ready: make(chan struct{}), servers: slices.Clone(servers)}
	close(lb.ready)
	go lb.serve()
	return lb, nil
}

// Name names the load balancer in the node's lifecycle.
func (lb *LB) Name() string { return "apiserver load balancer" }

// Ready is closed from the start: it listens once Start returns.
func (lb *LB) Ready() <-chan struct{} { return lb.ready }

// Err never delivers: a server that does not answer is skipped, not fatal.
func (lb *LB) Err() <-chan error { return nil }

// Stop stops accepting connections; those made stay until they end.
func (lb *LB) Stop(context.Context) error {
	lb.stopOnce.Do(func() { lb.listener.Close() })
	return nil
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
// address the node joined through) stays last. It returns nil when ctx
// ends, unless no apiserver ever answered the list by then: that error,
// like any failure to follow, leaves the balancer with the servers it had.
func (lb *LB) Follow(ctx context.Context, client kubernetes.Interface, fallback []string) error {
	// The kubernetes Service's slices alone: not the node's cache, which
	// holds every EndpointSlice and is made after the balancer.
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(metav1.NamespaceDefault),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", kubernetesService).String()
			o.LabelSelector = discoveryv1.LabelServiceName + "=" + kubernetesService
		}))
	endpoints := factory.Discovery().V1().EndpointSlices()
	var applied []string
	return reconcile.Loop{
		Informers: map[string]cache.SharedIndexInformer{"endpointslices": endpoints.Informer()},
		Sync: func(context.Context, bool) error {
			list, err := endpoints.Lister().List(labels.Everything())
			if err != nil {
				return err
			}
			servers := Servers(list)
			for _, f := range fallback {
				if !slices.Contains(servers, f) {
					servers = append(servers, f)
				}
			}
			// Set only when they changed: setting forgets which server
			// answered last.
			if !slices.Equal(servers, applied) {
				lb.SetServers(servers)
				applied = servers
			}
			return nil
		},
	}.Run(ctx)
}

// Servers lists the host:port of the ready endpoints in the slice that
// the apiserver publishes among eps. Other slices with the service-name
// label are not the apiserver's, whoever made them: someone allowed to
// create EndpointSlices in default would otherwise choose where the
// node's apiserver connections go.
func Servers(eps []*discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range eps {
		if !published(s) {
			continue
		}
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

// published tells the EndpointSlice that the apiserver writes itself.
func published(s *discoveryv1.EndpointSlice) bool {
	_, managed := s.Labels[discoveryv1.LabelManagedBy]
	return s.Namespace == metav1.NamespaceDefault && s.Name == kubernetesService &&
		s.Labels[discoveryv1.LabelServiceName] == kubernetesService && !managed
}
