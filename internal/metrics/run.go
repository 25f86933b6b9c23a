package metrics

import (
	"context"
	"crypto/tls"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	discoveryv1ac "k8s.io/client-go/applyconfigurations/discovery/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/apply"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/informer"
	"github.com/kelp-dev/kelp/internal/pki"
)

const (
	// Port is where every server serves the metrics API. The Service
	// kube-system/metrics-server (embed/manifests/metrics-server.yaml)
	// names it as its targetPort.
	Port = 10260
	// Namespace and Service are what the APIService
	// v1beta1.metrics.k8s.io points at.
	Namespace = "kube-system"
	Service   = "metrics-server"
	// portName is the Service's port name, which the EndpointSlice must
	// repeat for the aggregator to find its port.
	portName = "https"
)

var log = logrus.WithField("component", "metrics")

// Config is what the metrics API is served with.
type Config struct {
	// Client reaches the apiserver as the admin: it lists pods and
	// publishes the EndpointSlice.
	Client *rest.Config
	// Informers are the server's cache, whose Nodes the scraper and the
	// API read.
	Informers *informer.Cache
	// BindAddress is where to listen (the apiserver's --bind-address);
	// AdvertiseAddress is where the apiservers reach this server.
	BindAddress, AdvertiseAddress netip.Addr
	// NodeName names this server's EndpointSlice: every server of a
	// cluster publishes its own.
	NodeName      string
	ClusterDomain string
	// Certs has the server CA (signs the serving certificate, verifies
	// the kubelets), the front-proxy CA (verifies the aggregator) and the
	// apiserver's kubelet client certificate (reads the kubelets).
	Certs pki.Files
}

// Start listens, publishes this server's address for the aggregator and
// runs the scraper and the API until stopped. A port that is taken fails
// here.
func Start(ctx context.Context, cfg Config) (*component.Running, error) {
	apiTLS, err := apiTLSConfig(cfg)
	if err != nil {
		return nil, err
	}
	kubeletTLS, err := kubeletTLSConfig(cfg.Certs)
	if err != nil {
		return nil, err
	}
	rc := rest.CopyConfig(cfg.Client)
	rest.AddUserAgent(rc, "kelp-metrics")
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	meta, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}

	addr := net.JoinHostPort(cfg.BindAddress.String(), strconv.Itoa(Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w (`ss -ltnp 'sport = %d'` shows who holds it; or run kelp with --disable metrics-server)", addr, err, Port)
	}
	slice := endpointSliceName(cfg.NodeName)
	if err := publish(ctx, client, slice, cfg.AdvertiseAddress); err != nil {
		ln.Close()
		return nil, err
	}
	log.WithFields(logrus.Fields{"address": addr, "endpointslice": Namespace + "/" + slice}).Debug("serving the metrics API")

	store := NewStore()
	s := &server{
		informers: cfg.Informers,
		nodes:     cfg.Informers.Core().V1().Nodes(),
		client:    client,
		meta:      meta,
		slice:     slice,
		listen:    ln,
		tls:       apiTLS,
		store:     store,
		scraper:   NewScraper(store, kubeletTLS, log),
	}
	// Asked for now, before the server starts its cache.
	s.nodes.Informer()
	return component.Go("metrics", s.run), nil
}

type server struct {
	informers *informer.Cache
	nodes     coreinformers.NodeInformer
	client    kubernetes.Interface
	meta      metadata.Interface
	slice     string
	listen    net.Listener
	tls       *tls.Config
	store     *Store
	scraper   *Scraper
}

func (s *server) run(ctx context.Context) error {
	defer s.listen.Close()
	defer s.withdraw()
	nodes := s.nodes
	// Metadata only, unlike the server's cache of whole objects: pods
	// are the most numerous objects, and the API needs their labels.
	podFactory := metadatainformer.NewSharedInformerFactoryWithOptions(s.meta, 0, metadatainformer.WithTransform(slimMetadata))
	pods := podFactory.ForResource(corev1.SchemeGroupVersion.WithResource("pods"))
	// A factory starts the informers asked for before its Start.
	pods.Informer()
	s.informers.Start()
	podFactory.Start(ctx.Done())
	defer podFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		return fmt.Errorf("list nodes: %w", ctx.Err())
	}
	for gvr, ok := range podFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("list %v: %w", gvr.Resource, ctx.Err())
		}
	}

	errorLog := log.WriterLevel(logrus.DebugLevel) // TLS handshakes that fail: scanners, mostly
	defer errorLog.Close()
	srv := &http.Server{
		Handler:           NewAPI(s.store, nodes.Lister(), pods.Lister()),
		TLSConfig:         s.tls,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          stdlog.New(errorLog, "", 0),
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(s.listen, "", "") }()

	tick := time.NewTicker(Interval)
	defer tick.Stop()
	for {
		all, err := nodes.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		s.scraper.Scrape(ctx, all)
		select {
		case <-tick.C:
		case err := <-served:
			return fmt.Errorf("serve the metrics API: %w", err)
		case <-ctx.Done():
			shutdown(srv)
			return nil
		}
	}
}

// shutdown lets requests in flight end for a second: it runs within the
// server's stop deadline.
func shutdown(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		srv.Close()
	}
}

// withdraw deletes this server's EndpointSlice, so that the aggregator
// sends nothing to a server that is gone.
func (s *server) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.client.DiscoveryV1().EndpointSlices(Namespace).Delete(ctx, s.slice, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		log.WithError(err).Warn("withdraw the metrics API's EndpointSlice; the apiserver sends it requests until this server runs again")
	}
}

// publish applies this server's EndpointSlice of the metrics-server
// Service. The apiserver runs with --enable-aggregator-routing and so
// sends metrics.k8s.io requests to an endpoint from the Service's
// EndpointSlices (not Endpoints), picked at random among the ready ones.
func publish(ctx context.Context, c kubernetes.Interface, name string, addr netip.Addr) error {
	addr = addr.Unmap()
	family := discoveryv1.AddressTypeIPv4
	if addr.Is6() {
		family = discoveryv1.AddressTypeIPv6
	}
	slice := discoveryv1ac.EndpointSlice(name, Namespace).
		WithLabels(map[string]string{
			discoveryv1.LabelServiceName: Service,
			// Not the EndpointSlice controller's: it leaves the slice alone.
			discoveryv1.LabelManagedBy: apply.FieldManager,
		}).
		WithAddressType(family).
		WithEndpoints(discoveryv1ac.Endpoint().
			WithAddresses(addr.String()).
			WithConditions(discoveryv1ac.EndpointConditions().WithReady(true))).
		WithPorts(discoveryv1ac.EndpointPort().
			WithName(portName).
			WithPort(Port).
			WithProtocol(corev1.ProtocolTCP))
	_, err := c.DiscoveryV1().EndpointSlices(Namespace).Apply(ctx, slice, apply.Options())
	if err != nil {
		return fmt.Errorf("metrics: publish the EndpointSlice %s/%s: %w", Namespace, name, err)
	}
	return nil
}

func endpointSliceName(node string) string {
	return Service + "-" + strings.ToLower(node)
}

// slimMetadata keeps of a pod's metadata what label selectors need.
func slimMetadata(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	return &metav1.PartialObjectMetadata{
		TypeMeta: m.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, Labels: m.Labels,
		},
	}, nil
}
