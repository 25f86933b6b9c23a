package mirror

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// Peer is another node that may have content.
type Peer struct {
	Name string
	Addr netip.AddrPort // its Registry
}

// Mirror answers the node's own containerd: it asks every peer which has
// the content (HEAD) and streams it from the first that has, or answers
// 404 so that containerd tries the next host of the registry.
type Mirror struct {
	// Peers are the other nodes, at the time of a request.
	Peers func() []Peer
	// Transport reaches peers; see NewTransport.
	Transport http.RoundTripper
	// AskTimeout bounds the question to each peer.
	AskTimeout time.Duration
}

// NewTransport reaches the peers named in a URL's host by their node name
// (the name ClientTLS checks their certificate for) at the address peers
// gives.
func NewTransport(id Identity, peers func() []Peer) *http.Transport {
	dialer := &net.Dialer{Timeout: 3 * time.Second}
	return &http.Transport{
		TLSClientConfig: id.ClientTLS(),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			name, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			for _, p := range peers() {
				if p.Name == name {
					return dialer.DialContext(ctx, network, p.Addr.String())
				}
			}
			return nil, fmt.Errorf("node %s is not a peer", name)
		},
		TLSHandshakeTimeout:   3 * time.Second,
		ResponseHeaderTimeout: 10 * time.Second,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       time.Minute,
	}
}

func (m Mirror) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	path, ns, ok := pullRequest(w, req)
	if !ok {
		return
	}
	// A tag that moves by convention is the registry's to resolve: a peer
	// has the one it pulled last.
	if strings.HasSuffix(path, "/manifests/latest") {
		registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", "latest is resolved by the registry, not by other nodes")
		return
	}
	rel := &url.URL{Path: req.URL.Path, RawQuery: url.Values{"ns": {ns}}.Encode()}
	haves, cancel := m.ask(req.Context(), rel)
	defer cancel()
	for have := range haves {
		if req.Method == http.MethodHead {
			copyHeaders(w, have.header)
			w.WriteHeader(http.StatusOK)
			return
		}
		if m.fetch(w, req, have.peer, rel) {
			return
		}
	}
	code := "BLOB_UNKNOWN"
	if strings.Contains(path, "/manifests/") {
		code = "MANIFEST_UNKNOWN"
	}
	registryError(w, http.StatusNotFound, code, "no other node has "+path)
}

type have struct {
	peer   Peer
	header http.Header
}

// ask sends HEAD of rel to every peer at once and delivers those that have
// it as they answer; the channel closes once all did. cancel ends the
// questions still open.
func (m Mirror) ask(ctx context.Context, rel *url.URL) (<-chan have, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, m.AskTimeout)
	peers := m.Peers()
	out := make(chan have, len(peers))
	done := make(chan struct{}, len(peers))
	for _, p := range peers {
		go func() {
			defer func() { done <- struct{}{} }()
			req, err := http.NewRequestWithContext(ctx, http.MethodHead, peerURL(p, rel), nil)
			if err != nil {
				return
			}
			resp, err := m.Transport.RoundTrip(req)
			if err != nil {
				if ctx.Err() == nil {
					log.WithError(err).WithField("peer", p.Name).Debug("ask a peer")
				}
				return
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				out <- have{p, resp.Header}
			}
		}()
	}
	go func() {
		for range peers {
			<-done
		}
		close(out)
	}()
	return out, cancel
}

// fetch streams the GET of rel from p to w and reports whether it
// answered; a peer that fails before its answer began leaves w untouched.
func (m Mirror) fetch(w http.ResponseWriter, req *http.Request, p Peer, rel *url.URL) bool {
	preq, err := http.NewRequestWithContext(req.Context(), http.MethodGet, peerURL(p, rel), nil)
	if err != nil {
		return false
	}
	for _, h := range []string{"Accept", "Range", "If-Range"} {
		if v := req.Header.Values(h); len(v) > 0 {
			preq.Header[h] = v
		}
	}
	resp, err := m.Transport.RoundTrip(preq)
	if err != nil {
		log.WithError(err).WithField("peer", p.Name).Info("fetch from a peer failed; trying another")
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		log.WithField("peer", p.Name).Infof("fetch %s from a peer: %s; trying another", rel.Path, resp.Status)
		return false
	}
	copyHeaders(w, resp.Header)
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, resp.Body); err != nil {
		// containerd sees a short body and fails the pull; it verifies
		// what it got by digest in any case.
		log.WithError(err).WithField("peer", p.Name).Info("fetch from a peer broke off")
	}
	return true
}

func peerURL(p Peer, rel *url.URL) string {
	return "https://" + net.JoinHostPort(p.Name, fmt.Sprint(p.Addr.Port())) + rel.String()
}

// copyHeaders copies the headers that describe content.
func copyHeaders(w http.ResponseWriter, from http.Header) {
	for _, h := range []string{"Content-Type", "Content-Length", "Docker-Content-Digest", "Content-Range", "Accept-Ranges"} {
		if v := from.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
}
