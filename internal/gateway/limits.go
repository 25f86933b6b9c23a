package gateway

import (
	"cmp"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bound what the data path's clients can hold of the kelp process,
// which also runs the apiserver, often on a small machine on a public
// address: connections that sit idle, send slowly or pile up would
// otherwise grow it until the machine runs out of memory. A zero field
// takes its default; the defaults follow nginx's and Envoy's and are in the
// README.
type Limits struct {
	// Header is how long a client has to send a request's headers, and
	// the TLS handshake before the first.
	Header time.Duration
	// Idle is how long a kept-alive connection waits for its next request.
	Idle time.Duration
	// BodyProgress is how long a request body may go without a byte
	// arriving. It is not a deadline for the whole body, which would cut
	// a large upload that keeps coming.
	BodyProgress time.Duration
	// BackendHeader is how long a backend has to begin its response once
	// it has the request.
	BackendHeader time.Duration
	// MaxHeaderBytes bounds a request's header; a larger one is answered
	// 431.
	MaxHeaderBytes int
	// MaxConns caps the connections open at once on one listening port,
	// and MaxConnsPerSource those of one client address among them.
	MaxConns          int
	MaxConnsPerSource int
}

// orDefaults is l with each zero field set to its default.
func (l Limits) orDefaults() Limits {
	return Limits{
		// nginx's client_header_timeout is 60 s; kelp always had 30 s.
		Header: cmp.Or(l.Header, 30*time.Second),
		// nginx's keepalive_timeout.
		Idle: cmp.Or(l.Idle, 75*time.Second),
		// nginx's client_body_timeout, also between two reads.
		BodyProgress: cmp.Or(l.BodyProgress, 60*time.Second),
		// nginx's proxy_read_timeout, which covers the response header.
		BackendHeader: cmp.Or(l.BackendHeader, 60*time.Second),
		// Envoy allows 60 KiB, nginx 4 lines of 8 KiB; Go's own 1 MiB
		// would let each connection hold that much.
		MaxHeaderBytes: cmp.Or(l.MaxHeaderBytes, 64<<10),
		// nginx's 512 worker_connections times a worker per core of a
		// Raspberry Pi; an idle connection costs kelp about 7 KiB
		// resident (scripts/bench-gateway-conns.sh).
		MaxConns: cmp.Or(l.MaxConns, 2048),
		// Room for a NAT of a few dozen browsers, 6 connections each per
		// host name, while 8 addresses cannot fill a port.
		MaxConnsPerSource: cmp.Or(l.MaxConnsPerSource, 256),
	}
}

// warnRefusedEvery is how often, at most, a port logs the connections it
// refused: a flood must not flood the log too.
const warnRefusedEvery = time.Minute

// capListener refuses a connection over its caps by closing it as soon as
// it is accepted: golang.org/x/net/netutil's LimitListener would leave it
// unaccepted, in the kernel's queue, where the client waits with no answer
// and the next clients wait behind it.
type capListener struct {
	net.Listener
	port           int32
	max, perSource int

	mu       sync.Mutex
	open     int
	bySource map[netip.Prefix]int
	refused  int // since the last warning
	warned   time.Time
}

func newCapListener(ln net.Listener, port int32, l Limits) *capListener {
	return &capListener{Listener: ln, port: port, max: l.MaxConns, perSource: l.MaxConnsPerSource, bySource: map[netip.Prefix]int{}}
}

// source is the client address a connection counts against: an IPv6
// client's /64, which a single host commonly has whole.
func source(remote net.Addr) netip.Prefix {
	tcp, ok := remote.(*net.TCPAddr)
	if !ok {
		return netip.Prefix{}
	}
	a := tcp.AddrPort().Addr().Unmap().WithZone("")
	if a.Is4() {
		return netip.PrefixFrom(a, 32)
	}
	p, _ := a.Prefix(64)
	return p
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := source(c.RemoteAddr())
		if l.take(src) {
			return &cappedConn{Conn: c, l: l, src: src}, nil
		}
		_ = c.Close()
	}
}

// take counts a connection from src, or says it is over a cap.
func (l *capListener) take(src netip.Prefix) bool {
	l.mu.Lock()
	if l.open < l.max && l.bySource[src] < l.perSource {
		l.open++
		l.bySource[src]++
		l.mu.Unlock()
		return true
	}
	l.refused++
	refused, now := l.refused, time.Now()
	warn := now.Sub(l.warned) >= warnRefusedEvery
	if warn {
		l.warned, l.refused = now, 0
	}
	l.mu.Unlock()
	if warn {
		log.Warnf("port %d refused %d connections over its caps of %d open connections, %d from one client address (%s: the latest): "+
			"a client holds too many open, or the node has more clients than it serves at once",
			l.port, refused, l.max, l.perSource, src)
	}
	return false
}

func (l *capListener) release(src netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.bySource[src]--; l.bySource[src] == 0 {
		delete(l.bySource, src)
	}
}

// cappedConn gives its place back once closed, by the server or by the
// proxy that hijacked it (an upgrade).
type cappedConn struct {
	net.Conn
	l    *capListener
	src  netip.Prefix
	once sync.Once
}

func (c *cappedConn) Close() error {
	c.once.Do(func() { c.l.release(c.src) })
	return c.Conn.Close()
}

// bodyProgress cuts a request whose body stops arriving for d, from the
// handler's reads and from the server's own after it, which discard what
// the handler left.
func bodyProgress(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			_ = rc.SetReadDeadline(time.Now().Add(d))
			r.Body = &progressBody{ReadCloser: r.Body, rc: rc, d: d}
		}
		h.ServeHTTP(w, r)
	})
}

type progressBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	d       time.Duration
	stalled atomic.Bool
}

func (b *progressBody) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(b.d))
	n, err := b.ReadCloser.Read(p)
	switch {
	case errors.Is(err, io.EOF):
		// Past the body, the HTTP/1 server reads on its own to see the
		// client go: a deadline would cancel the request while the
		// backend answers.
		_ = b.rc.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.stalled.Store(true)
	}
	return n, err
}

// bodyStalled says whether body stopped arriving. The proxy asks it
// rather than the error, which is as often the request's context, cancelled
// by the same read.
func bodyStalled(body io.Reader) bool {
	b, ok := body.(*progressBody)
	return ok && b.stalled.Load()
}
