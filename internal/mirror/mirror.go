package mirror

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	listersv1 "k8s.io/client-go/listers/core/v1"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/informer"
)

var log = logrus.WithField("component", "registry mirror")

// Port is the mirror's on every node: on the node's IP for the other
// nodes, on 127.0.0.1 for the node's containerd. k3s's embedded mirror
// (Spegel) takes the same port, for its peer-to-peer network.
const Port = 5001

// LocalEndpoint is where the node's containerd finds the mirror, first of
// the hosts of every registry it mirrors (registries.WriteHosts).
const LocalEndpoint = "http://127.0.0.1:5001"

// Config is one node's mirror.
type Config struct {
	NodeName string
	NodeIP   netip.Addr // where the other nodes reach it
	// Registries are those the node shares and pulls from its peers:
	// registries.yaml's mirrors; "*" is every registry.
	Registries []string
	Identity   Identity
	// Containerd is the address of the node's containerd.
	Containerd string
}

// askTimeout bounds the question to the peers of whether they have
// something: a node that does not answer in time is passed over.
const askTimeout = 2 * time.Second

// Start listens on the mirror's two addresses and serves until the piece
// is stopped; informers are the node's cache, whose Nodes are the peers
// (TrimNodeStatus says what of them it reads).
func Start(cfg Config, informers *informer.Cache) (*component.Running, error) {
	if len(cfg.Registries) == 0 {
		return nil, errors.New("mirror: no registry to mirror")
	}
	c, err := client.New(cfg.Containerd)
	if err != nil {
		return nil, fmt.Errorf("mirror: connect to containerd: %w", err)
	}
	peerAddr := net.JoinHostPort(cfg.NodeIP.String(), strconv.Itoa(Port))
	localAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(Port))
	var listeners []net.Listener
	for _, addr := range []string{peerAddr, localAddr} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			c.Close()
			return nil, fmt.Errorf("the registry mirror cannot listen on %s (%w): another program holds port %d (`ss -ltnp 'sport = %d'` shows which), or the node IP is not an address of this machine (--node-ip)", addr, err, Port, Port)
		}
		listeners = append(listeners, l)
	}
	lister := informers.Core().V1().Nodes().Lister()
	peers := func() []Peer { return peersOf(lister, cfg.NodeName, cfg.NodeIP) }
	shares := func(registry string) bool {
		return slices.Contains(cfg.Registries, "*") || slices.Contains(cfg.Registries, registry)
	}
	transport := NewTransport(cfg.Identity, peers)
	servers := []*http.Server{
		{Handler: NewRegistry(containerdStore{c}, shares), TLSConfig: cfg.Identity.ServerTLS(), ReadHeaderTimeout: 10 * time.Second},
		{Handler: ownUser{uid: uint32(os.Getuid()), next: NewMirror(peers, transport, shares)}, ReadHeaderTimeout: 10 * time.Second},
	}
	return component.Go("registry mirror", func(ctx context.Context) error {
		defer c.Close()
		defer transport.CloseIdleConnections()
		informers.Start()
		errc := make(chan error, len(servers))
		go func() { errc <- servers[0].ServeTLS(listeners[0], "", "") }()
		go func() { errc <- servers[1].Serve(listeners[1]) }()
		log.WithFields(logrus.Fields{"nodes": peerAddr, "containerd": localAddr, "registries": cfg.Registries}).Info("registry mirror serving")
		var err error
		select {
		case <-ctx.Done():
		case err = <-errc:
			err = fmt.Errorf("mirror: %w", err)
		}
		stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, s := range servers {
			_ = s.Shutdown(stop)
		}
		return err
	}), nil
}

// peersOf lists the Ready nodes but self, at their internal IP of self's
// address family.
func peersOf(lister listersv1.NodeLister, self string, ip netip.Addr) []Peer {
	nodes, err := lister.List(labels.Everything())
	if err != nil {
		return nil
	}
	var out []Peer
	for _, n := range nodes {
		if n.Name == self || !ready(n) {
			continue
		}
		for _, a := range n.Status.Addresses {
			addr, err := netip.ParseAddr(a.Address)
			if a.Type == corev1.NodeInternalIP && err == nil && addr.Is4() == ip.Is4() {
				out = append(out, Peer{Name: n.Name, Addr: netip.AddrPortFrom(addr, Port)})
				break
			}
		}
	}
	return out
}

// TrimNodeStatus keeps of a Node's status what peersOf reads: its
// addresses and whether it is Ready.
func TrimNodeStatus(s corev1.NodeStatus) corev1.NodeStatus {
	out := corev1.NodeStatus{Addresses: s.Addresses}
	for _, c := range s.Conditions {
		if c.Type == corev1.NodeReady {
			out.Conditions = []corev1.NodeCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return out
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
