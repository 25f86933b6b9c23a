package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"

	"github.com/google/nftables"
)

// plan is the table for a list of ports: each port by its name (portName),
// and the elements the ports have in the shared sets (sharedSets), each
// key (an address . protocol . port, or a protocol . port of the node) to
// the chain traffic goes to. A key of serviceIPs to "" is an element of
// no-endpoints instead.
type plan struct {
	names      []string
	ports      map[string]Port
	serviceIPs map[string]string
	nodePorts  map[string]string
}

// newPlan lays out the ports of family f in its table. Where two ports
// claim the same name or the same key, the first wins: Services come
// before hostPorts.
func newPlan(ports []Port, f *family) plan {
	pl := plan{ports: map[string]Port{}, serviceIPs: map[string]string{}, nodePorts: map[string]string{}}
	claim := func(m map[string]string, key []byte, chain string) {
		if _, taken := m[string(key)]; !taken {
			m[string(key)] = chain
		}
	}
	for _, p := range ports {
		if p.family() != f {
			continue
		}
		name := portName(p)
		if _, taken := pl.ports[name]; taken {
			continue
		}
		pl.names = append(pl.names, name)
		pl.ports[name] = p
		internal, external := targets(name, p)
		if p.ClusterIP.IsValid() {
			claim(pl.serviceIPs, concat(p.ClusterIP.AsSlice(), []byte{p.Protocol}, port(p.Port)), internal)
		}
		for _, ip := range p.ExternalIPs {
			if familyOf(ip) == f {
				claim(pl.serviceIPs, concat(ip.AsSlice(), []byte{p.Protocol}, port(p.Port)), external)
			}
		}
		// A port of the node without an endpoint behind it is left to
		// whoever else claims it.
		if p.NodePort != 0 && external != "" {
			claim(pl.nodePorts, concat([]byte{p.Protocol}, port(p.NodePort)), external)
		}
	}
	return pl
}

// update changes the proxy's tables from programming before to
// programming after in a single netlink batch, touching only the ports
// that changed: their chains are flushed and filled again, or deleted or
// added, their endpoint maps replaced, and their elements in the shared
// sets changed. The clients in affinity sets that stay as they were keep
// sticking to their endpoints. It returns how many chains the tables
// gained (or lost).
//
// The tables must hold before, as Apply or update left them for the same
// clusterCIDRs. Where someone else changed them, the batch most likely
// fails as a whole; the caller then replaces the tables with Apply.
func update(c *nftables.Conn, clusterCIDRs []netip.Prefix, before, after []Port) (int, error) {
	var changes []tableChange
	for _, f := range families {
		if cidr, ok := cidrOf(clusterCIDRs, f); ok {
			changes = append(changes, newTableChange(c, f, cidr, before, after))
		}
	}
	chains := 0
	for _, tc := range changes {
		n, err := tc.add(c)
		if err != nil {
			return 0, err
		}
		chains += n
	}
	if err := c.Flush(); err != nil {
		return 0, fmt.Errorf("update nftables table %s: %w", Table, err)
	}
	return chains, nil
}

// tableChange is what update changes in the table of one family.
type tableChange struct {
	t         *nftables.Table
	f         *family
	old, next plan
	// going and coming are the ports whose objects go (gone or changed)
	// and come (changed or new), in the order of their ports; oldObjs and
	// newObjs their objects.
	going, coming    []string
	oldObjs, newObjs map[string][]object
	keep             map[string]bool
	carried          map[string][]nftables.SetElement
}

// newTableChange compares the ports of family f before and after, and
// reads the affinity entries to carry over: before the batch, since what
// it deletes it cannot read.
func newTableChange(c *nftables.Conn, f *family, clusterCIDR netip.Prefix, before, after []Port) tableChange {
	tc := tableChange{t: f.proxyTable(), f: f, old: newPlan(before, f), next: newPlan(after, f),
		oldObjs: map[string][]object{}, newObjs: map[string][]object{}}
	changed := map[string]bool{}
	for _, name := range tc.old.names {
		p, ok := tc.next.ports[name]
		if !ok || !reflect.DeepEqual(p, tc.old.ports[name]) {
			tc.going = append(tc.going, name)
			changed[name] = ok
		}
	}
	for _, name := range tc.next.names {
		if _, ok := tc.old.ports[name]; !ok || changed[name] {
			tc.coming = append(tc.coming, name)
		}
	}
	for _, name := range tc.going {
		tc.oldObjs[name] = portObjects(tc.t, f, name, clusterCIDR, tc.old.ports[name])
	}
	for _, name := range tc.coming {
		tc.newObjs[name] = portObjects(tc.t, f, name, clusterCIDR, tc.next.ports[name])
	}
	var recreate []*nftables.Set
	tc.keep, recreate = affinityChanges(tc.oldObjs, tc.newObjs)
	tc.carried = entriesOf(c, recreate)
	return tc
}

// add adds the change to the batch of c, and returns how many chains the
// table gains (or loses).
func (tc tableChange) add(c *nftables.Conn) (int, error) {
	serviceIPs, nodePorts, noEndpoints := sharedSets(tc.t, tc.f)
	ipsGone, ipsNew := elementChanges(tc.old.serviceIPs, tc.next.serviceIPs)
	nodePortsGone, nodePortsNew := elementChanges(tc.old.nodePorts, tc.next.nodePorts)
	// First the elements that lead to chains that go or change.
	if err := changeSharedElements(c.SetDeleteElements, serviceIPs, nodePorts, noEndpoints, ipsGone, nodePortsGone); err != nil {
		return 0, err
	}
	chains := 0
	for _, name := range tc.going {
		objs := tc.oldObjs[name]
		staying := map[string]bool{}
		for _, o := range tc.newObjs[name] {
			if o.chain != nil {
				staying[o.chain.Name] = true
			}
		}
		// Emptied first, the port's chains refer to no set or chain any
		// more; then its sets go, and with the endpoint maps' elements the
		// last references to its chains. (Older kernels keep those of a
		// map deleted whole until the batch ends: they are flushed first.)
		for _, o := range objs {
			if o.chain != nil {
				c.FlushChain(o.chain)
			}
		}
		for _, o := range objs {
			if o.set != nil && !tc.keep[o.set.Name] {
				if o.set.IsMap {
					c.FlushSet(o.set)
				}
				c.DelSet(o.set)
			}
		}
		for _, o := range objs {
			if o.chain != nil {
				chains--
				if !staying[o.chain.Name] {
					c.DelChain(o.chain)
				}
			}
		}
	}
	for _, name := range tc.coming {
		objs := tc.newObjs[name]
		if err := addObjects(c, objs, tc.carried, tc.keep); err != nil {
			return 0, err
		}
		for _, o := range objs {
			if o.chain != nil {
				chains++
			}
		}
	}
	// Last the elements that lead to chains that came or changed.
	if err := changeSharedElements(c.SetAddElements, serviceIPs, nodePorts, noEndpoints, ipsNew, nodePortsNew); err != nil {
		return 0, err
	}
	return chains, nil
}

// affinityChanges says which affinity sets of the ports that change stay
// as they are (keep: their clients keep sticking), and which are replaced
// by one of another timeout (recreate, with the clients carried over).
func affinityChanges(oldObjs, newObjs map[string][]object) (keep map[string]bool, recreate []*nftables.Set) {
	keep = map[string]bool{}
	for name, objs := range newObjs {
		was := map[string]*nftables.Set{}
		for _, o := range oldObjs[name] {
			if o.set != nil && o.set.Dynamic {
				was[o.set.Name] = o.set
			}
		}
		for _, o := range objs {
			if o.set == nil || !o.set.Dynamic || was[o.set.Name] == nil {
				continue
			}
			if s := was[o.set.Name]; s.Timeout == o.set.Timeout && s.HasTimeout == o.set.HasTimeout {
				keep[o.set.Name] = true
			} else {
				recreate = append(recreate, s)
			}
		}
	}
	return keep, recreate
}

// elementChanges compares the elements of a shared set: those that are
// gone or lead elsewhere, to delete; those that are new or lead elsewhere,
// to add.
func elementChanges(before, after map[string]string) (gone, added map[string]string) {
	gone, added = map[string]string{}, map[string]string{}
	for k, chain := range before {
		if now, ok := after[k]; !ok || now != chain {
			gone[k] = chain
		}
	}
	for k, chain := range after {
		if was, ok := before[k]; !ok || was != chain {
			added[k] = chain
		}
	}
	return gone, added
}

// changeSharedElements adds (or deletes) elements of the shared sets.
func changeSharedElements(change func(*nftables.Set, []nftables.SetElement) error, serviceIPs, nodePorts, noEndpoints *nftables.Set, ips, nodePortKeys map[string]string) error {
	ipElems, noEndpointElems, nodePortElems := elements(ips, nodePortKeys)
	return errors.Join(
		changeElements(change, serviceIPs, ipElems),
		changeElements(change, noEndpoints, noEndpointElems),
		changeElements(change, nodePorts, nodePortElems))
}
