package mirror

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// ownUser lets only the processes of user uid, the one kelp and so its
// containerd run as, through to next.
//
// The local face is plain HTTP on 127.0.0.1, and it asks the other nodes
// with this node's identity: any process of the machine, of any user (or
// a pod of the host's network), could otherwise read through it the
// content that the other nodes share, images pulled with an
// imagePullSecret included, which it cannot read from this node's
// containerd. TCP carries no credentials (SO_PEERCRED is for unix
// sockets, which containerd's hosts cannot name), but the kernel's socket
// table (sock_diag, as ss reads it) says which user owns the other end of
// a connection over loopback.
type ownUser struct {
	uid  uint32
	next http.Handler
}

func (o ownUser) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	uid, err := clientUID(req)
	if err != nil {
		log.WithError(err).Warn("cannot tell which user asks the registry mirror; refused (the kernel needs inet_diag and tcp_diag, as ss does)")
		registryError(w, http.StatusForbidden, "DENIED", "the registry mirror cannot tell which user asks: "+err.Error())
		return
	}
	if uid != o.uid {
		log.WithField("uid", uid).Warn("a process of another user than containerd's asked the registry mirror; refused")
		registryError(w, http.StatusForbidden, "DENIED", fmt.Sprintf("the registry mirror answers only containerd, a process of user %d; this is user %d", o.uid, uid))
		return
	}
	o.next.ServeHTTP(w, req)
}

// clientUID returns the user who owns the socket at the other end of the
// TCP connection of req.
func clientUID(req *http.Request) (uint32, error) {
	server, ok := req.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	if !ok {
		return 0, errors.New("not a TCP connection")
	}
	addr, err := netip.ParseAddrPort(req.RemoteAddr)
	if err != nil {
		return 0, err
	}
	client := net.TCPAddrFromAddrPort(addr)
	s, err := netlink.SocketGet(client, server)
	if err != nil {
		return 0, fmt.Errorf("look up the socket of %s: %w", client, err)
	}
	// The kernel matches the ports; the addresses must match too.
	if !s.ID.Source.Equal(client.IP) || int(s.ID.SourcePort) != client.Port || !s.ID.Destination.Equal(server.IP) || int(s.ID.DestinationPort) != server.Port {
		return 0, fmt.Errorf("the kernel named socket %s:%d, not %s", s.ID.Source, s.ID.SourcePort, client)
	}
	return s.UID, nil
}
