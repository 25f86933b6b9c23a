package gateway

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	stdlog "log"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	k8sinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/informer"
)

// ConfigSecret is the Secret (in kube-system) the controller publishes the
// data path's Config in, under ConfigKey.
const (
	ConfigSecret = "kelp-gateway"
	ConfigKey    = "config.json"
)

var log = logrus.WithField("component", "gateway")

// retryListen is how often the data path tries again a port it could not
// listen on.
const retryListen = 30 * time.Second

// serviceIndex indexes EndpointSlices by namespace/service.
const serviceIndex = "service"

// ServeConfig is what a node's data path needs.
type ServeConfig struct {
	// NodeName is the node's: it reports the ports it cannot listen on in
	// an annotation of its own Node.
	NodeName string
	// ListenHost is the address listeners bind; empty: every address.
	ListenHost string
	// AddressesFile records the Gateway addresses the node holds, so that
	// those a crash left are released when it starts again, and by kelp
	// killall.
	AddressesFile string
	// Limits bound the clients; zero fields take their defaults.
	Limits Limits
}

// Serve runs the node's data path until ctx ends: it reads the Secret
// ConfigSecret with client (the node's controller identity) and
// EndpointSlices from informers (the node's cache, of that identity),
// listens on each port of the config and proxies requests as it says. It
// holds the Gateway addresses the config gives the node, and releases them
// when it returns.
func Serve(ctx context.Context, client kubernetes.Interface, informers *informer.Cache, cfg ServeConfig) error {
	held, err := loadHolder(cfg.AddressesFile, cfg.NodeName)
	if err != nil {
		return err
	}
	// What a crash left goes at once: the node may have lost an address
	// to another meanwhile, and would answer for it until the config is
	// read. It takes back, and announces again, those still its own.
	release := func() {
		if err := held.releaseAll(); err != nil {
			log.WithError(err).Error("cannot release the Gateway addresses this node held: kelp killall removes them")
		}
	}
	release()
	defer release()
	d := &dataPath{client: client, cfg: cfg, servers: map[int32]*portServer{}, changed: make(chan struct{}, 1)}
	d.transport = backendTransport(cfg.Limits.orDefaults())
	d.current.Store(&compiled{regexps: newRegexpCache(Config{})})
	// The servers' own errors (a client's failed TLS handshake) are
	// nothing an operator acts on.
	errWriter := log.WriterLevel(logrus.DebugLevel)
	defer errWriter.Close()
	d.errorLog = stdlog.New(errWriter, "", 0)

	// One Secret by name: the node may read no other, and the node's cache
	// holds whole kinds.
	secrets := k8sinformers.NewSharedInformerFactoryWithOptions(client, 0, k8sinformers.WithNamespace(metav1.NamespaceSystem),
		k8sinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ConfigSecret).String()
		}))
	si := secrets.Core().V1().Secrets().Informer()
	notify := func() {
		select {
		case d.changed <- struct{}{}:
		default:
		}
	}
	if _, err := si.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}); err != nil {
		return err
	}
	ei := informers.Discovery().V1().EndpointSlices().Informer()
	if err := ei.AddIndexers(cache.Indexers{serviceIndex: func(obj any) ([]string, error) {
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok || s.Labels[discoveryv1.LabelServiceName] == "" {
			return nil, nil
		}
		return []string{s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]}, nil
	}}); err != nil {
		return err
	}
	d.endpoints = ei.GetIndexer()
	secrets.Start(ctx.Done())
	informers.Start()
	defer secrets.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), si.HasSynced, ei.HasSynced) {
		return nil
	}
	d.secrets = si.GetStore()
	defer d.closeAll()
	tick := time.NewTicker(retryListen)
	defer tick.Stop()
	notify()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.changed:
			d.load()
		case <-tick.C:
		}
		d.listen(ctx)
		held.sync(d.current.Load().addresses)
		d.inUse = held.inUseReport()
		d.report(ctx)
	}
}

// backendTransport is the proxy's, to the backends' endpoints.
func backendTransport(l Limits) *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: l.BackendHeader,
	}
}

// compiled is a Config ready to serve.
type compiled struct {
	cfg Config
	// addresses are the Gateways' own addresses, with the node that holds
	// each.
	addresses map[netip.Addr]string
	// protocols are the listening ports: one listener per port number
	// serves it on every address.
	protocols map[int32]string
	ports     map[portKey]*Port
	certs     map[portKey]map[string]*tls.Certificate // by host name
	regexps   *regexpCache
}

// portKey is a Port's address (zero: the nodes' own) and number.
type portKey struct {
	addr netip.Addr
	port int32
}

// port is the Port that serves a connection to local on port number n:
// that of the Gateway address if local is one (nil if it has none on n:
// a Gateway's address serves its own listeners alone), else that of the
// nodes' own addresses.
func (c *compiled) port(local net.Addr, n int32) (*Port, portKey) {
	k := portKey{port: n}
	if tcp, ok := local.(*net.TCPAddr); ok {
		if a := tcp.AddrPort().Addr().Unmap().WithZone(""); a.IsValid() {
			if _, ok := c.addresses[a]; ok {
				k.addr = a
			}
		}
	}
	return c.ports[k], k
}

type dataPath struct {
	client    kubernetes.Interface
	cfg       ServeConfig
	transport http.RoundTripper
	errorLog  *stdlog.Logger
	secrets   cache.Store
	endpoints cache.Indexer
	current   atomic.Pointer[compiled]
	changed   chan struct{}

	mu      sync.Mutex
	servers map[int32]*portServer
	// reported are the annotations last written; nil before the first
	// write.
	reported map[string]string
	failed   map[int32]string
	// inUse are the Gateway addresses the node found in use, as
	// InUseAnnotation says them.
	inUse string
}

type portServer struct {
	protocol string
	srv      *http.Server
}

// load reads the Secret into d.current.
func (d *dataPath) load() {
	var cfg Config
	obj, ok, _ := d.secrets.GetByKey(metav1.NamespaceSystem + "/" + ConfigSecret)
	if ok {
		s := obj.(*corev1.Secret)
		if err := json.Unmarshal(s.Data[ConfigKey], &cfg); err != nil {
			log.WithError(err).Warn("the gateway configuration in the Secret kube-system/kelp-gateway is not valid; keeping the last one")
			return
		}
	}
	c := &compiled{cfg: cfg, addresses: map[netip.Addr]string{}, protocols: map[int32]string{},
		ports: map[portKey]*Port{}, certs: map[portKey]map[string]*tls.Certificate{}, regexps: newRegexpCache(cfg)}
	for _, h := range cfg.Addresses {
		a, err := netip.ParseAddr(h.Address)
		if err != nil {
			log.WithError(err).Warnf("Gateway address %q is not valid", h.Address)
			continue
		}
		c.addresses[a.Unmap()] = h.Node
	}
	pairs := map[string]*tls.Certificate{}
	for id, cert := range cfg.Certs {
		pair, err := tls.X509KeyPair(cert.Cert, cert.Key)
		if err != nil {
			log.WithError(err).Warnf("certificate %s", id)
			continue
		}
		pairs[id] = &pair
	}
	for i := range cfg.Ports {
		p := &cfg.Ports[i]
		k := portKey{port: p.Port}
		if p.Address != "" {
			a, err := netip.ParseAddr(p.Address)
			if err != nil {
				log.WithError(err).WithField("port", p.Port).Warnf("Gateway address %q is not valid", p.Address)
				continue
			}
			k.addr = a.Unmap()
			if _, ok := c.addresses[k.addr]; !ok {
				// Held by no node, but still not the nodes' own.
				c.addresses[k.addr] = ""
			}
		}
		if _, ok := c.protocols[p.Port]; !ok {
			c.protocols[p.Port] = p.Protocol
		}
		c.ports[k] = p
		c.certs[k] = map[string]*tls.Certificate{}
		for _, h := range p.Hosts {
			if pair := pairs[h.CertID]; pair != nil {
				c.certs[k][h.Hostname] = pair
			}
		}
	}
	d.current.Store(c)
}

// listen makes the listening ports those of the current config.
func (d *dataPath) listen(ctx context.Context) {
	c := d.current.Load()
	limits := d.cfg.Limits.orDefaults()
	d.mu.Lock()
	defer d.mu.Unlock()
	for port, s := range d.servers {
		if protocol, ok := c.protocols[port]; !ok || protocol != s.protocol {
			_ = s.srv.Close()
			delete(d.servers, port)
		}
	}
	failed := map[int32]string{}
	for port, protocol := range c.protocols {
		if _, ok := d.servers[port]; ok {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(d.cfg.ListenHost, strconv.Itoa(int(port))))
		if err != nil {
			failed[port] = err.Error()
			if _, was := d.failed[port]; !was {
				log.WithError(err).Errorf("cannot listen on port %d for the Gateway API: its listeners are not served on this node until the port is free", port)
			}
			continue
		}
		if _, was := d.failed[port]; was {
			log.Infof("listening on port %d for the Gateway API", port)
		}
		srv := &http.Server{
			Handler:           bodyProgress(d.handler(port, protocol == "HTTPS"), limits.BodyProgress),
			ReadHeaderTimeout: limits.Header,
			IdleTimeout:       limits.Idle,
			MaxHeaderBytes:    limits.MaxHeaderBytes,
			ErrorLog:          d.errorLog,
		}
		// Capped below TLS: a connection refused costs no handshake.
		ln = newCapListener(ln, port, limits)
		if protocol == "HTTPS" {
			srv.TLSConfig = &tls.Config{GetCertificate: d.certificate(port), MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
			ln = tls.NewListener(ln, srv.TLSConfig)
		}
		d.servers[port] = &portServer{protocol: protocol, srv: srv}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.WithError(err).Warnf("port %d stopped serving", port)
			}
		}()
	}
	d.failed = failed
	d.report(ctx)
}

// report publishes on the node's Node the ports it cannot listen on, for
// the controller to show in the listeners' status, the networks it is
// on, so that it is given only Gateway addresses it can hold, and the
// addresses it found in use. It runs on the data path's one loop, as
// listen does.
func (d *dataPath) report(ctx context.Context) {
	var ports []string
	for p := range d.failed {
		ports = append(ports, strconv.Itoa(int(p)))
	}
	slices.Sort(ports)
	want := map[string]string{UnavailablePortsAnnotation: strings.Join(ports, ","), NetworksAnnotation: networks(), InUseAnnotation: d.inUse}
	if d.reported != nil && maps.Equal(d.reported, want) {
		return
	}
	annotations := map[string]any{}
	for k, v := range want {
		annotations[k] = v
		if v == "" {
			annotations[k] = nil
		}
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if _, err := d.client.CoreV1().Nodes().Patch(ctx, d.cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kelp-gateway"}); err != nil {
		entry := log.WithError(err)
		if apierrors.IsNotFound(err) {
			// The kubelet has not registered the node yet.
			entry.Debug("could not report the ports, networks and addresses in use of this node; trying again")
		} else {
			entry.Warn("could not report the ports, networks and addresses in use of this node; trying again")
		}
		return
	}
	d.reported = want
}

// closeAll stops every port, letting requests in flight finish for a
// moment: the node's stop has a deadline.
func (d *dataPath) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for port, s := range d.servers {
		wg.Go(func() {
			if s.srv.Shutdown(ctx) != nil {
				_ = s.srv.Close()
			}
		})
		delete(d.servers, port)
	}
	wg.Wait()
}

// certificate chooses the certificate of an HTTPS port by the address the
// client reached and SNI, from the current config: a Secret's update
// reaches new connections at once and leaves open ones as they are.
func (d *dataPath) certificate(port int32) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		c := d.current.Load()
		var local net.Addr
		if hello.Conn != nil {
			local = hello.Conn.LocalAddr()
		}
		p, k := c.port(local, port)
		if p == nil {
			return nil, fmt.Errorf("port %d is not served on %s", port, local)
		}
		h := matchHost(p.Hosts, strings.ToLower(hello.ServerName))
		if h != nil {
			if cert := c.certs[k][h.Hostname]; cert != nil {
				return cert, nil
			}
		}
		// No listener for the name: any certificate of the port, so that
		// the client can tell what it reached.
		for _, h := range p.Hosts {
			if cert := c.certs[k][h.Hostname]; cert != nil {
				return cert, nil
			}
		}
		return nil, fmt.Errorf("no certificate on port %d for %q", port, hello.ServerName)
	}
}

// handler routes the requests of one port.
func (d *dataPath) handler(port int32, https bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := d.current.Load()
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		p, _ := c.port(local, port)
		host := strings.ToLower(r.Host)
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		var h *Host
		if p != nil {
			h = matchHost(p.Hosts, host)
		}
		if h == nil {
			http.Error(w, "no listener for this host", http.StatusNotFound)
			return
		}
		// A connection made for one listener (by SNI) does not carry
		// requests for another: a client that reuses connections across
		// host names must open one for this host.
		if https && r.TLS != nil && r.TLS.ServerName != "" && matchHost(p.Hosts, strings.ToLower(r.TLS.ServerName)) != h {
			http.Error(w, "this connection was made for another host name", http.StatusMisdirectedRequest)
			return
		}
		rt := matchRoute(h.Routes, r, host, c.regexps)
		if rt == nil {
			http.Error(w, "no route matches this request", http.StatusNotFound)
			return
		}
		if rt.Redirect != nil {
			redirectTo(w, r, rt, port, https, host)
			return
		}
		b := pickBackend(rt.Backends)
		if b == nil || b.Invalid {
			http.Error(w, "the route's backend is not valid: see the HTTPRoute's status", http.StatusInternalServerError)
			return
		}
		addr := d.endpoint(b)
		if addr == "" {
			http.Error(w, "no ready endpoint for the route's backend", http.StatusServiceUnavailable)
			return
		}
		d.proxy(w, r, rt, b, addr, https)
	})
}

// endpoint picks one ready endpoint of the backend, host:port.
func (d *dataPath) endpoint(b *Backend) string {
	objs, _ := d.endpoints.ByIndex(serviceIndex, b.Namespace+"/"+b.Service)
	var addrs []string
	for _, o := range objs {
		s := o.(*discoveryv1.EndpointSlice)
		var port int32
		found := false
		for _, p := range s.Ports {
			if p.Port != nil && ptrOr(p.Name, "") == b.PortName {
				port, found = *p.Port, true
			}
		}
		if !found {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				addrs = append(addrs, net.JoinHostPort(a, strconv.Itoa(int(port))))
			}
		}
	}
	if len(addrs) == 0 {
		return ""
	}
	return addrs[randN(len(addrs))]
}

func (d *dataPath) proxy(w http.ResponseWriter, r *http.Request, rt *Route, b *Backend, addr string, https bool) {
	rp := &httputil.ReverseProxy{
		Transport: d.transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = addr
			pr.Out.Host = pr.In.Host
			if rt.Rewrite != nil {
				if rt.Rewrite.Hostname != "" {
					pr.Out.Host = rt.Rewrite.Hostname
				}
				if m := rt.Rewrite.Path; m != nil {
					pr.Out.URL.Path = modifyPath(m, rt.Path, pr.In.URL.Path)
					pr.Out.URL.RawPath = ""
				}
			}
			pr.SetXForwarded()
			applyHeaders(pr.Out.Header, rt.Request)
			applyHeaders(pr.Out.Header, b.Request)
		},
		ModifyResponse: func(resp *http.Response) error {
			applyHeaders(resp.Header, rt.Response)
			applyHeaders(resp.Header, b.Response)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			log.WithError(err).WithField("route", rt.Name).Debug("proxy")
			if bodyStalled(r.Body) {
				http.Error(w, "the request body stopped arriving", http.StatusRequestTimeout)
				return
			}
			http.Error(w, "the backend did not answer", http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(w, r)
}

func modifyPath(m *PathModifier, match PathMatch, path string) string {
	switch {
	case m.Full != nil:
		return *m.Full
	case m.Prefix != nil && match.Type == PathPrefix:
		return replacePrefix(path, match.Value, *m.Prefix)
	}
	return path
}

func redirectTo(w http.ResponseWriter, r *http.Request, rt *Route, port int32, https bool, host string) {
	rd := rt.Redirect
	scheme := "http"
	if https {
		scheme = "https"
	}
	redirectPort := port
	if rd.Scheme != "" {
		scheme = rd.Scheme
		redirectPort = 0
		if rd.Scheme == "https" {
			redirectPort = 443
		} else if rd.Scheme == "http" {
			redirectPort = 80
		}
	}
	if rd.Port != 0 {
		redirectPort = rd.Port
	}
	if rd.Hostname != "" {
		host = rd.Hostname
	}
	hostPort := host
	if redirectPort != 0 && !(scheme == "http" && redirectPort == 80) && !(scheme == "https" && redirectPort == 443) {
		hostPort = net.JoinHostPort(host, strconv.Itoa(int(redirectPort)))
	}
	path := r.URL.Path
	if rd.Path != nil {
		path = modifyPath(rd.Path, rt.Path, path)
	}
	u := url.URL{Scheme: scheme, Host: hostPort, Path: path, RawQuery: r.URL.RawQuery}
	applyHeaders(w.Header(), rt.Response)
	w.Header().Set("Location", u.String())
	w.WriteHeader(rd.Status)
}
