package metrics

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
)

const (
	// Interval is how often every kubelet is read: metrics-server's
	// default, and what the HPA's 15 s sync period expects.
	Interval = 15 * time.Second
	// scrapeTimeout bounds one read of a kubelet, so that a round ends
	// before the next begins.
	scrapeTimeout = 10 * time.Second
	// maxParallel bounds the reads in flight.
	maxParallel = 16
	// maxBody bounds what a kubelet may send: /metrics/resource is about
	// 300 bytes per container.
	maxBody = 16 << 20
)

// Scraper reads the kubelets' resource metrics into a Store.
type Scraper struct {
	store  *Store
	client *http.Client
	log    logrus.FieldLogger

	mu   sync.Mutex
	down map[string]bool // nodes whose last read failed, reported once
}

// NewScraper returns a Scraper that reads kubelets over TLS with tlsConfig
// (the apiserver's kubelet client certificate, and the CA the kubelets'
// serving certificates are signed by) into store.
func NewScraper(store *Store, tlsConfig *tls.Config, log logrus.FieldLogger) *Scraper {
	return &Scraper{
		store: store,
		client: &http.Client{
			Timeout: scrapeTimeout,
			Transport: &http.Transport{
				TLSClientConfig:     tlsConfig,
				DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
				TLSHandshakeTimeout: 5 * time.Second,
				// A connection kept open would keep presenting the client
				// certificate of its handshake after it was renewed, until
				// that one expired.
				DisableKeepAlives: true,
			},
		},
		log:  log,
		down: map[string]bool{},
	}
}

// Scrape reads every Ready node once, in parallel, and returns when all
// reads have ended. The figures of other nodes are dropped: a node that is
// not Ready yet may not serve yet either, and one that went NotReady was
// reported while it stopped answering.
func (s *Scraper) Scrape(ctx context.Context, nodes []*corev1.Node) {
	ready := map[string]bool{}
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxParallel)
	for _, n := range nodes {
		if !isReady(n) {
			continue
		}
		ready[n.Name] = true
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			s.scrapeNode(ctx, n)
		})
	}
	wg.Wait()
	s.store.Keep(ready)
	s.mu.Lock()
	maps.DeleteFunc(s.down, func(name string, _ bool) bool { return !ready[name] })
	s.mu.Unlock()
}

func (s *Scraper) scrapeNode(ctx context.Context, n *corev1.Node) {
	r, err := s.read(ctx, n)
	if ctx.Err() != nil {
		return // stopping: not the node's fault
	}
	s.mu.Lock()
	wasDown := s.down[n.Name]
	s.down[n.Name] = err != nil
	s.mu.Unlock()
	log := s.log.WithField("node", n.Name)
	if err != nil {
		s.store.Missed(n.Name)
		if !wasDown {
			log.WithError(err).Warnf("cannot read the kubelet's resource metrics; the node's figures are dropped after %d missed reads of one every %s", maxMissed, Interval)
		}
		return
	}
	if wasDown {
		log.Info("the kubelet's resource metrics can be read again")
	}
	s.store.Add(n.Name, r)
}

// read fetches and parses one kubelet's /metrics/resource.
func (s *Scraper) read(ctx context.Context, n *corev1.Node) (Reading, error) {
	url, err := kubeletURL(n)
	if err != nil {
		return Reading{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Reading{}, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	began := time.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		return Reading{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return Reading{}, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	r, err := Parse(io.LimitReader(resp.Body, maxBody), began)
	if err != nil {
		return Reading{}, fmt.Errorf("GET %s: %w", url, err)
	}
	return r, nil
}

// kubeletURL is where n's kubelet serves, at the address the apiserver
// would use (--kubelet-preferred-address-types InternalIP, ExternalIP,
// Hostname).
func kubeletURL(n *corev1.Node) (string, error) {
	port := n.Status.DaemonEndpoints.KubeletEndpoint.Port
	if port <= 0 {
		return "", errors.New("the node reports no kubelet port yet")
	}
	for _, t := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP, corev1.NodeHostName} {
		for _, a := range n.Status.Addresses {
			if a.Type == t && a.Address != "" {
				return "https://" + net.JoinHostPort(a.Address, strconv.Itoa(int(port))) + "/metrics/resource", nil
			}
		}
	}
	return "", errors.New("the node reports no address yet")
}

func isReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
