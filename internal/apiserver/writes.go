package apiserver

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/kelp-dev/kelp/internal/pki"
)

// ForeignWrites is told, before the apiserver serves it, of a write by a
// client other than kelp's own pieces: who made it and what it writes,
// in words. It returns whether it wants to hear of more.
type ForeignWrites func(who, what string) (more bool)

// kelpGroups are the groups of what kelp runs on other nodes: kubelets,
// and kelp's node-side controllers; and the service accounts of
// kube-system, kelp's addons and the controller-manager's controllers.
var kelpGroups = []string{user.NodesGroup, pki.ControllerGroup, "system:serviceaccounts:kube-system"}

// unkept are resources whose writes nobody misses: leases and events,
// the steady chatter of every client, and the reviews and tokens that a
// create asks for but nothing stores.
var unkept = []struct{ group, resource, subresource string }{
	{"coordination.k8s.io", "leases", ""},
	{"", "events", ""},
	{"events.k8s.io", "events", ""},
	{"authentication.k8s.io", "*", ""},
	{"authorization.k8s.io", "*", ""},
	{"", "serviceaccounts", "token"},
}

var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection"}

// watchWrites passes every request to next, and first tells report of a
// write that stores something, by a client other than kelp's own pieces:
// this process (the server's controllers, controller-manager, scheduler
// and node, whatever identity they use, the admin's included) or what
// kelp runs elsewhere (kelpGroups). It runs inside the apiserver's
// filters, after authentication and authorization.
func watchWrites(next http.Handler, report ForeignWrites) http.Handler {
	var done atomic.Bool
	own := &ownSockets{known: map[uint64]bool{}}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !done.Load() {
			if who, what, ok := foreignWrite(req, own.from); ok && !report(who, what) {
				done.Store(true)
			}
		}
		next.ServeHTTP(w, req)
	})
}

// foreignWrite says who writes what with req, when it is a write that
// stores something by a client that is not kelp's own; fromKelp says
// whether the request came from this process.
func foreignWrite(req *http.Request, fromKelp func(*http.Request) bool) (who, what string, ok bool) {
	info, found := request.RequestInfoFrom(req.Context())
	if !found || !info.IsResourceRequest || !slices.Contains(writeVerbs, info.Verb) || req.URL.Query().Get("dryRun") != "" {
		return "", "", false
	}
	for _, u := range unkept {
		if u.group == info.APIGroup && (u.resource == "*" || u.resource == info.Resource) && u.subresource == info.Subresource {
			return "", "", false
		}
	}
	u, found := request.UserFrom(req.Context())
	if !found || u.GetName() == user.APIServerUser || slices.ContainsFunc(u.GetGroups(), func(g string) bool { return slices.Contains(kelpGroups, g) }) {
		return "", "", false
	}
	if fromKelp(req) {
		return "", "", false
	}
	resource := info.Resource
	if info.Subresource != "" {
		resource += "/" + info.Subresource
	}
	if info.APIGroup != "" {
		resource += "." + info.APIGroup
	}
	what = info.Verb + " " + resource
	if info.Name != "" {
		what += " " + info.Name
	}
	if info.Namespace != "" {
		what += " in " + info.Namespace
	}
	return fmt.Sprintf("%s from %s", u.GetName(), req.RemoteAddr), what, true
}

// ownSockets tells whether the other end of a request's connection is a
// socket of this process: a client over loopback, as the kernel's socket
// table (sock_diag) names it, among this process's files.
type ownSockets struct {
	mu    sync.Mutex
	known map[uint64]bool // socket inode: this process's
}

func (o *ownSockets) from(req *http.Request) bool {
	server, ok := req.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	local, err := netip.ParseAddrPort(server.String())
	if err != nil {
		return false
	}
	remote, err := netip.ParseAddrPort(req.RemoteAddr)
	if err != nil || !remote.Addr().IsLoopback() && remote.Addr() != local.Addr() {
		return false
	}
	s, err := netlink.SocketGet(net.TCPAddrFromAddrPort(remote), net.TCPAddrFromAddrPort(local))
	if err != nil || s.INode == 0 {
		return false
	}
	inode := uint64(s.INode)
	o.mu.Lock()
	defer o.mu.Unlock()
	if mine, ok := o.known[inode]; ok {
		return mine
	}
	mine := hasSocket(inode)
	o.known[inode] = mine
	return mine
}

// hasSocket says whether this process holds the socket of inode.
func hasSocket(inode uint64) bool {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return false
	}
	want := fmt.Sprintf("socket:[%d]", inode)
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.EqualFold(target, want) {
			return true
		}
	}
	return false
}
