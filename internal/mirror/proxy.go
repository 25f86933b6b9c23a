package mirror

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
)

// Peer is another node that may have content.
type Peer struct {
	Name string
	Addr netip.AddrPort // its Registry
}

// Mirror answers the node's own containerd: it asks every peer which has
// the manifest or blob of a digest (HEAD) and passes on the answer of the
// first that has, checked against the digest, or answers 404 so that
// containerd tries the next host of the registry. Tags never reach the
// peers (see Registry): containerd resolves them with the registry, or
// the endpoints the admin lists in registries.yaml.
type Mirror struct {
	peers     func() []Peer
	transport http.RoundTripper
	shares    func(registry string) bool
	distrust  distrust
}

// NewMirror asks the peers, at the time of each request, through
// transport (see NewTransport), for the registries shares accepts.
func NewMirror(peers func() []Peer, transport http.RoundTripper, shares func(registry string) bool) *Mirror {
	return &Mirror{peers: peers, transport: transport, shares: shares, distrust: distrust{until: map[string]time.Time{}}}
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

func (m *Mirror) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	p, ok := pullRequest(w, req, m.shares)
	if !ok {
		return
	}
	rel := &url.URL{Path: req.URL.Path, RawQuery: url.Values{"ns": {p.registry}}.Encode()}
	haves, cancel := m.ask(req.Context(), rel)
	defer cancel()
	for have := range haves {
		switch {
		case p.manifest:
			ok = m.manifest(w, req, have.peer, rel, p.digest)
		case req.Method == http.MethodHead:
			ok = blobHead(w, have.header, p.digest)
		default:
			ok = m.blob(w, req, have.peer, rel, p.digest)
		}
		if ok {
			return
		}
	}
	registryError(w, http.StatusNotFound, p.unknown(), fmt.Sprintf("no other node has %s of %s", p.digest, p.registry))
}

type have struct {
	peer   Peer
	header http.Header
}

// ask sends HEAD of rel to every peer not distrusted at once and delivers
// those that have it as they answer; the channel closes once all did.
// cancel ends the questions still open.
func (m *Mirror) ask(ctx context.Context, rel *url.URL) (<-chan have, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	var peers []Peer
	for _, p := range m.peers() {
		if !m.distrust.has(p.Name) {
			peers = append(peers, p)
		}
	}
	out := make(chan have, len(peers))
	done := make(chan struct{}, len(peers))
	for _, p := range peers {
		go func() {
			defer func() { done <- struct{}{} }()
			req, err := http.NewRequestWithContext(ctx, http.MethodHead, peerURL(p, rel), nil)
			if err != nil {
				return
			}
			resp, err := m.transport.RoundTrip(req)
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

// manifest passes on p's manifest d, for a GET or a HEAD alike, once it
// checked that it is d's content; it reports whether it did. Its media
// type is what the content says, not what p says.
func (m *Mirror) manifest(w http.ResponseWriter, req *http.Request, p Peer, rel *url.URL, d digest.Digest) bool {
	resp, err := m.get(req.Context(), p, rel)
	if err != nil {
		log.WithError(err).WithField("peer", p.Name).Info("fetch from a peer failed; trying another")
		return false
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxManifest+1))
	if err != nil {
		log.WithError(err).WithField("peer", p.Name).Info("fetch from a peer broke off; trying another")
		return false
	}
	if d.Algorithm().FromBytes(data) != d {
		m.distrust.add(p.Name, d)
		return false
	}
	mediaType, ok := manifestType(data)
	if !ok {
		log.WithField("peer", p.Name).Infof("%s from a peer is not a manifest; trying another", d)
		return false
	}
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Header().Set("Docker-Content-Digest", d.String())
	if req.Method == http.MethodGet {
		_, _ = w.Write(data)
	}
	return true
}

// blob streams p's blob d to w and reports whether p answered; a peer that
// fails before its answer began leaves w untouched. A blob is too large
// to hold before it is checked: it goes on as it arrives but for its last
// bytes, which go once all of it hashed to d, so that other content never
// arrives whole: containerd sees an answer cut short, and pulls again,
// from another node (p is distrusted) or the registry.
//
// The whole blob is always fetched and passed on: a Range (containerd's
// resume of a pull) cannot be checked on its own, and containerd skips
// what it has of an answer that ignored it.
func (m *Mirror) blob(w http.ResponseWriter, req *http.Request, p Peer, rel *url.URL, d digest.Digest) bool {
	resp, err := m.get(req.Context(), p, rel)
	if err != nil {
		log.WithError(err).WithField("peer", p.Name).Info("fetch from a peer failed; trying another")
		return false
	}
	defer resp.Body.Close()
	if resp.ContentLength < 0 {
		// Cut short, an answer of no stated length would look whole.
		log.WithField("peer", p.Name).Infof("%s from a peer has no length; trying another", d)
		return false
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	w.Header().Set("Docker-Content-Digest", d.String())
	w.WriteHeader(http.StatusOK)
	err = copyVerified(w, resp.Body, d)
	switch {
	case errors.Is(err, errOtherContent):
		m.distrust.add(p.Name, d)
	case err != nil:
		log.WithError(err).WithField("peer", p.Name).Info("fetch from a peer broke off")
	}
	return true
}

// blobHead answers a HEAD of blob d with the length a peer's answer
// header states, which containerd checks with the content, and reports
// whether it did.
func blobHead(w http.ResponseWriter, header http.Header, d digest.Digest) bool {
	size, err := strconv.ParseInt(header.Get("Content-Length"), 10, 64)
	if err != nil || size < 0 {
		return false
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.Header().Set("Docker-Content-Digest", d.String())
	return true
}

// get sends GET of rel to p and returns its answer if it has the content.
func (m *Mirror) get(ctx context.Context, p Peer, rel *url.URL) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, peerURL(p, rel), nil)
	if err != nil {
		return nil, err
	}
	resp, err := m.transport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", rel.Path, resp.Status)
	}
	return resp, nil
}

var errOtherContent = errors.New("the content is not the digest's")

// copyVerified copies body to w, but for the last bytes it read, which it
// writes only once all of body hashed to d.
func copyVerified(w io.Writer, body io.Reader, d digest.Digest) error {
	verifier := d.Verifier()
	buf, held := make([]byte, 32<<10), make([]byte, 0, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			_, _ = verifier.Write(buf[:n])
			if _, err := w.Write(held); err != nil {
				return err
			}
			held = append(held[:0], buf[:n]...)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	if !verifier.Verified() {
		return errOtherContent
	}
	_, err := w.Write(held)
	return err
}

// distrustFor is how long a peer that answered with other content than
// the digest asked for is not asked: its root lies, or its disk broke.
const distrustFor = time.Hour

// distrust keeps the peers not to ask, by name, until a time.
type distrust struct {
	mu    sync.Mutex
	until map[string]time.Time
}

func (t *distrust) add(peer string, d digest.Digest) {
	log.WithField("peer", peer).Warnf("a peer answered for %s with other content; it is not asked again for %s: look at that node, whose root may be trying to make the others run its images", d, distrustFor)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.until[peer] = time.Now().Add(distrustFor)
}

func (t *distrust) has(peer string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	until, ok := t.until[peer]
	if ok && time.Now().After(until) {
		delete(t.until, peer)
		return false
	}
	return ok
}

func peerURL(p Peer, rel *url.URL) string {
	return "https://" + net.JoinHostPort(p.Name, fmt.Sprint(p.Addr.Port())) + rel.String()
}
