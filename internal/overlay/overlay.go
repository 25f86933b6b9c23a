package overlay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kelp-dev/kelp/internal/informer"
	"github.com/kelp-dev/kelp/internal/reconcile"
)

// The backends.
const (
	// BackendVXLAN encapsulates pod traffic in VXLAN: nodes only need to
	// reach each other by IP.
	BackendVXLAN = "vxlan"
	// BackendHostGW routes pod traffic to the other node's IP as it is:
	// no overhead, but all nodes must be on one L2 segment.
	BackendHostGW = "host-gw"
	// BackendNone leaves pod traffic between nodes to a CNI the user
	// brings.
	BackendNone = "none"
)

const (
	// coalesce is how long Run waits after a change for more before it
	// programs the kernel: nodes joining at once come one by one.
	coalesce = 100 * time.Millisecond
	// resyncEvery is how often Run programs the kernel even without a
	// change, in case someone deleted one of kelp's entries.
	resyncEvery = 30 * time.Second
)

var log = logrus.WithField("component", "overlay")

// Config is what the overlay needs to know of the node and the cluster.
type Config struct {
	// Backend is BackendVXLAN, BackendHostGW or BackendNone; all nodes
	// of a cluster need the same.
	Backend  string
	NodeName string
	// NodeIPs are where other nodes send this node's overlay traffic, at
	// most one per family. VXLAN runs over the one of the cluster's
	// primary family (see Config.underlay); host-gw routes each family's
	// pods via the node IP of that family.
	NodeIPs []netip.Addr
	// Iface is the interface overlay traffic leaves by; "" is the one
	// that has the node IP of the traffic's family.
	Iface string
	// ClusterCIDRs hold all pod CIDRs, the primary first, at most one per
	// family; kelp routes nothing outside them.
	ClusterCIDRs []netip.Prefix
}

// Validate reports what is wrong with cfg.
func (cfg Config) Validate() error {
	switch cfg.Backend {
	case BackendVXLAN, BackendHostGW, BackendNone:
	default:
		return fmt.Errorf("unknown overlay backend %q: use %s, %s or %s", cfg.Backend, BackendVXLAN, BackendHostGW, BackendNone)
	}
	if cfg.NodeName == "" {
		return errors.New("no node name")
	}
	if len(cfg.NodeIPs) == 0 {
		return errors.New("no node IP: pass --node-ip")
	}
	seen := map[family]netip.Addr{}
	for _, ip := range cfg.NodeIPs {
		if !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() || ip.Is4In6() || ip.Zone() != "" {
			return fmt.Errorf("node IP %v: not a unicast IP address other nodes can reach", ip)
		}
		if other, ok := seen[familyOf(ip)]; ok {
			return fmt.Errorf("node IPs %v and %v: give at most one %s node IP", other, ip, familyOf(ip))
		}
		seen[familyOf(ip)] = ip
	}
	if len(cfg.ClusterCIDRs) == 0 {
		return errors.New("no cluster CIDR")
	}
	cidrs := map[family]netip.Prefix{}
	for _, cidr := range cfg.ClusterCIDRs {
		if !cidr.IsValid() || cidr.Addr().Is4In6() {
			return fmt.Errorf("cluster CIDR %v: not a valid IPv4 or IPv6 CIDR", cidr)
		}
		if other, ok := cidrs[familyOf(cidr.Addr())]; ok {
			return fmt.Errorf("cluster CIDRs %v and %v: give at most one %s cluster CIDR", other, cidr, familyOf(cidr.Addr()))
		}
		cidrs[familyOf(cidr.Addr())] = cidr
	}
	if cfg.Backend == BackendHostGW {
		// host-gw has no tunnel to carry one family over the other.
		for f, cidr := range cidrs {
			if _, ok := seen[f]; !ok {
				return fmt.Errorf("backend host-gw routes the %s pods of cluster CIDR %v via the nodes' %s node IPs, and this node has none: add one to --node-ip, or use --overlay %s",
					f, cidr, f, BackendVXLAN)
			}
		}
	}
	return nil
}

// family is an IP address family.
type family int

const (
	ipv4 family = 4
	ipv6 family = 6
)

func familyOf(a netip.Addr) family {
	if a.Is4() || a.Is4In6() {
		return ipv4
	}
	return ipv6
}

func (f family) String() string {
	if f == ipv6 {
		return "IPv6"
	}
	return "IPv4"
}

// nodeIP returns the address of family f among ips; the zero Addr if
// there is none.
func nodeIP(ips []netip.Addr, f family) netip.Addr {
	for _, ip := range ips {
		if familyOf(ip) == f {
			return ip
		}
	}
	return netip.Addr{}
}

// underlayOf picks, of a node's node IPs, the one VXLAN runs over: the one
// of the cluster's primary family, or the node's only one. Every node
// picks its own and its peers' by this rule, so a VXLAN device (which
// sends and receives over one family) only ever talks to peers of its
// family.
func underlayOf(ips []netip.Addr, primary family) netip.Addr {
	if ip := nodeIP(ips, primary); ip.IsValid() {
		return ip
	}
	if len(ips) == 0 {
		return netip.Addr{}
	}
	return ips[0]
}

// underlay is the node IP this node's VXLAN device runs over.
func (cfg Config) underlay() netip.Addr {
	return underlayOf(cfg.NodeIPs, cfg.primary())
}

// primary is the cluster's primary family, that of the first cluster CIDR.
func (cfg Config) primary() family {
	return familyOf(cfg.ClusterCIDRs[0].Addr())
}

// Run publishes this node's overlay annotations and, once the node has a
// pod CIDR, routes to the pods of all other nodes, keeping the kernel in
// step with them until ctx ends. client may be the kubelet's: it patches
// only its own Node. Failures to publish or to program a peer are logged
// and tried again, since the API server or the peer may be fine later; Run
// returns an error only when cfg is unusable or the VXLAN device cannot be
// made. On return it leaves everything in place: pods keep talking while
// kelp restarts. It reads the Nodes of informers, the node's cache
// (TrimNode says what of them), and patches its own through client.
func Run(ctx context.Context, client kubernetes.Interface, informers *informer.Cache, cfg Config) error {
	return run(ctx, client, informers, cfg, resyncEvery)
}

func run(ctx context.Context, client kubernetes.Interface, informers *informer.Cache, cfg Config, resync time.Duration) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	o := &overlay{client: client, cfg: cfg, local: local{backend: cfg.Backend, ip: cfg.underlay(), mac: vtepMAC(cfg.NodeName)}}
	if cfg.Backend == BackendNone {
		// The CNI the user brings routes the same pod CIDRs: what kelp
		// routed before the switch to none would get in its way.
		if err := Remove(); err != nil {
			return err
		}
	} else {
		ups, err := uplinks(cfg)
		if err != nil {
			return err
		}
		o.local.uplinks = map[family]string{}
		for f, up := range ups {
			o.local.uplinks[f] = up.Attrs().Name
		}
		// Made now, not once the node has a pod CIDR, so a kernel
		// without VXLAN fails kelp at start, where it is seen.
		if cfg.Backend == BackendVXLAN {
			if err := guardNew(); err != nil {
				return err
			}
			if _, err := ensureDevice(o.local, ups[familyOf(o.local.ip)]); err != nil {
				return err
			}
			if slices.ContainsFunc(cfg.ClusterCIDRs, func(c netip.Prefix) bool { return c.Addr().Is6() }) {
				if err := ensureIPv6(Device); err != nil {
					return fmt.Errorf("the cluster has IPv6 pods (cluster CIDRs %v): %w", cfg.ClusterCIDRs, err)
				}
			}
		}
	}

	nodes := informers.Core().V1().Nodes()
	o.nodes = nodes.Lister()
	return reconcile.Loop{
		Informers: map[string]cache.SharedIndexInformer{"nodes": nodes.Informer()},
		Start:     informers.Start,
		Coalesce:  coalesce,
		Resync:    resync,
		Sync:      o.sync,
	}.Run(ctx)
}

// overlay is the state of Run between syncs.
type overlay struct {
	client kubernetes.Interface
	cfg    Config
	local  local
	nodes  corelisters.NodeLister
	// peers are those last programmed, and podCIDRs the node's then.
	peers    []Peer
	podCIDRs []netip.Prefix
	// programmed says whether programming succeeded once, from when on
	// changes of peers are logged; clean whether the last one did.
	programmed, clean bool
}

// sync publishes the node's annotations and programs the kernel when the
// node has its pod CIDRs and the peers changed, the last programming
// failed or it is the resync tick's pass (someone may have deleted an
// entry).
func (o *overlay) sync(ctx context.Context, resync bool) error {
	self, err := o.nodes.Get(o.cfg.NodeName)
	if err != nil {
		log.WithError(err).Debug("waiting for the node to register")
		return nil
	}
	if err := publish(ctx, o.client, self, o.cfg); err != nil {
		log.WithError(err).Warn("could not publish the node's overlay annotations; trying again")
	}
	if o.cfg.Backend == BackendNone {
		return nil
	}
	podCIDRs, err := nodePodCIDRs(self, o.cfg)
	if err != nil {
		log.WithError(err).Debug("waiting for the node to get its pod CIDRs")
		return nil
	}
	all, err := o.nodes.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	peers := Peers(all, o.cfg)
	if !resync && o.clean && slices.Equal(podCIDRs, o.podCIDRs) && reflect.DeepEqual(peers, o.peers) {
		return nil
	}
	l := o.local
	l.podCIDRs = podCIDRs
	err = program(l, peers)
	switch {
	case err != nil:
		log.WithError(err).Warn("could not program the overlay; trying again")
	case !o.programmed:
		log.WithFields(logrus.Fields{"backend": o.cfg.Backend, "pod-cidrs": podCIDRs, "peers": len(peers)}).Info("pod network overlay programmed")
	}
	if o.programmed {
		logChanges(o.peers, peers)
	}
	o.peers, o.podCIDRs, o.clean = peers, podCIDRs, err == nil
	o.programmed = o.programmed || err == nil
	return nil
}

// logChanges tells the operator which nodes were added, changed or removed.
func logChanges(before, after []Peer) {
	old := map[string]Peer{}
	for _, p := range before {
		old[p.Name] = p
	}
	for _, p := range after {
		fields := logrus.Fields{"node": p.Name, "pod-cidrs": p.PodCIDRs, "ips": p.IPs}
		if p.MAC != nil {
			fields["mac"] = p.MAC
		}
		q, ok := old[p.Name]
		delete(old, p.Name)
		switch {
		case !ok:
			log.WithFields(fields).Info("peer added")
		case !reflect.DeepEqual(p, q):
			log.WithFields(fields).Info("peer changed")
		}
	}
	for name := range old {
		log.WithField("node", name).Info("peer removed")
	}
}

// annotations are what node publishes; a nil value is an annotation it
// must not have, left by another backend or a node IP it no longer has.
func annotations(cfg Config) map[string]*string {
	a := map[string]*string{AnnotationBackend: &cfg.Backend, AnnotationPublicIP: nil, AnnotationPublicIPv6: nil, AnnotationVTEPMAC: nil}
	for f, key := range map[family]string{ipv4: AnnotationPublicIP, ipv6: AnnotationPublicIPv6} {
		if ip := nodeIP(cfg.NodeIPs, f); ip.IsValid() {
			s := ip.String()
			a[key] = &s
		}
	}
	if cfg.Backend == BackendVXLAN {
		mac := vtepMAC(cfg.NodeName).String()
		a[AnnotationVTEPMAC] = &mac
	}
	return a
}

// publish patches the annotations of node that are not as cfg wants them.
func publish(ctx context.Context, client kubernetes.Interface, node *corev1.Node, cfg Config) error {
	patch := map[string]*string{}
	for k, want := range annotations(cfg) {
		have, ok := node.Annotations[k]
		if ok != (want != nil) || (ok && have != *want) {
			patch[k] = want
		}
	}
	if len(patch) == 0 {
		return nil
	}
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": patch}})
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, data, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch annotations of node %s: %w", node.Name, err)
	}
	log.WithFields(logrus.Fields{"backend": cfg.Backend, "public-ips": cfg.NodeIPs}).Info("published the node's overlay annotations")
	return nil
}

// TrimNode keeps of a node only what Peers reads: every node caches every
// node of the cluster, and a node's status (images, conditions, heartbeats)
// is most of it.
func TrimNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	var ann map[string]string
	for k, v := range node.Annotations {
		if strings.HasPrefix(k, AnnotationPrefix) {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[k] = v
		}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: node.Name, ResourceVersion: node.ResourceVersion, Annotations: ann},
		Spec:       corev1.NodeSpec{PodCIDR: node.Spec.PodCIDR, PodCIDRs: node.Spec.PodCIDRs},
	}, nil
}
