package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Table names the proxy's nftables tables, one of family ip and one of
// family ip6 (where the cluster has IPv6); `kelp killall` removes them.
//
// One table per family rather than one of family inet: each holds maps
// keyed by its own address type and needs no check of the family before
// every match of an address; a cluster of one family has one table, so an
// IPv4 node upgraded from a kelp before dual-stack keeps the very table
// it had, and an IPv4 node registers no IPv6 NAT hooks (which would track
// every IPv6 connection of the host). kube-proxy's nftables mode splits
// its tables the same way. Both tables change in one netlink batch, so
// packets still never see a mix of old and new rules.
const Table = "kelp-proxy"

// family is what the tables of the two IP families differ in.
type family struct {
	table    nftables.TableFamily
	nat      uint32 // the NAT expression's family
	addrType nftables.SetDatatype
	// saddr and daddr are the offsets of the addresses in the network
	// header, addrLen their length.
	saddr, daddr, addrLen uint32
	// portUnreachable is the code of ICMP's, or ICMPv6's, destination
	// unreachable message for a closed port.
	portUnreachable uint8
}

var (
	ipv4 = &family{table: nftables.TableFamilyIPv4, nat: unix.NFPROTO_IPV4, addrType: nftables.TypeIPAddr,
		saddr: 12, daddr: 16, addrLen: 4, portUnreachable: 3}
	ipv6 = &family{table: nftables.TableFamilyIPv6, nat: unix.NFPROTO_IPV6, addrType: nftables.TypeIP6Addr,
		saddr: 8, daddr: 24, addrLen: 16, portUnreachable: 4}
	families = []*family{ipv4, ipv6}
)

// familyOf is the family of an address (an IPv4-mapped IPv6 address is
// one of IPv6: the proxy unmaps what it reads from the API).
func familyOf(a netip.Addr) *family {
	if a.Is6() {
		return ipv6
	}
	return ipv4
}

// family is the family of a Service port's ClusterIP, or of a hostPort's
// pod address.
func (p Port) family() *family {
	if !p.ClusterIP.IsValid() && len(p.Endpoints) > 0 {
		return familyOf(p.Endpoints[0].Addr())
	}
	return familyOf(p.ClusterIP)
}

// proxyTable is the family's Table, for the calls that take one.
func (f *family) proxyTable() *nftables.Table {
	return &nftables.Table{Name: Table, Family: f.table}
}

// keyRegisters are the 32-bit registers of protocol and port in a key of
// service-ips: the address takes register 1 (the 32-bit registers 8 to
// 11, of which IPv4 fills one), and they follow it.
func (f *family) keyRegisters() (protocol, port uint32) {
	protocol = 8 + f.addrLen/4
	return protocol, protocol + 1
}

// cidrOf is the cluster CIDR of family f, if the cluster has one.
func cidrOf(clusterCIDRs []netip.Prefix, f *family) (netip.Prefix, bool) {
	for _, p := range clusterCIDRs {
		if familyOf(p.Addr()) == f {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// masqMark marks a connection whose source must be rewritten to the
// node's: clients outside the pod network (the host itself, NodePort
// callers) and pods reaching themselves through their Service.
const masqMark = 0x4000

// Port is one port of a Service as the proxy programs it, or a pod's
// hostPort: one with only a NodePort (the host port) and one endpoint.
type Port struct {
	ClusterIP netip.Addr // invalid for a hostPort
	Protocol  uint8      // unix.IPPROTO_TCP, _UDP or _SCTP
	Port      uint16
	NodePort  uint16 // 0: none
	// ExternalIPs are further addresses of the port: the Service's
	// externalIPs and its load balancer ingress IPs.
	ExternalIPs []netip.Addr
	// Endpoints serve traffic from inside the cluster: all of the
	// Service's, or with internalTrafficPolicy Local this node's only.
	Endpoints []netip.AddrPort
	// ExternalLocal (externalTrafficPolicy Local) sends traffic from
	// outside the cluster to LocalEndpoints only, with its source address
	// kept; where there are none it is dropped, so a load balancer that
	// checks the health check port sends it elsewhere.
	ExternalLocal  bool
	LocalEndpoints []netip.AddrPort
	// Affinity, when not 0, sends a client back to the endpoint it used
	// last, until it has been quiet this long (sessionAffinity ClientIP).
	Affinity time.Duration
}

// Apply replaces the proxy's tables with ones programming ports, a table
// for each family of clusterCIDRs, in a single netlink batch: packets see
// the old rules or the new, never a mix. A table of a family the cluster
// does not have goes, and so do the ports of that family. Session affinity
// entries of the old tables carry over to the new.
func Apply(c *nftables.Conn, clusterCIDRs []netip.Prefix, ports []Port) error {
	affinity := map[*family]map[string][]nftables.SetElement{}
	for _, f := range families {
		if _, ok := cidrOf(clusterCIDRs, f); ok {
			affinity[f] = affinityEntries(c, f.proxyTable())
		}
	}
	for _, f := range families {
		t := f.proxyTable()
		c.AddTable(t) // so that the delete cannot fail on a fresh host
		c.DelTable(t)
		cidr, ok := cidrOf(clusterCIDRs, f)
		if !ok {
			continue
		}
		c.AddTable(t)
		pl := newPlan(ports, f)
		for _, name := range pl.names {
			if err := addObjects(c, portObjects(t, f, name, cidr, pl.ports[name]), affinity[f], nil); err != nil {
				return err
			}
		}
		if err := addBase(c, t, f, pl); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("program nftables table %s: %w", Table, err)
	}
	return nil
}

// sharedSets are the maps and the set every port has elements in: where
// traffic to an address . protocol . port goes, where traffic to a port of
// the node goes, and which Service ports have no endpoint.
func sharedSets(t *nftables.Table, f *family) (serviceIPs, nodePorts, noEndpoints *nftables.Set) {
	serviceIPs = &nftables.Set{
		Table: t, Name: "service-ips", IsMap: true, Concatenation: true,
		KeyType:  nftables.MustConcatSetType(f.addrType, nftables.TypeInetProto, nftables.TypeInetService),
		DataType: nftables.TypeVerdict,
	}
	nodePorts = &nftables.Set{
		Table: t, Name: "service-nodeports", IsMap: true, Concatenation: true,
		KeyType:  nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService),
		DataType: nftables.TypeVerdict,
	}
	noEndpoints = &nftables.Set{
		Table: t, Name: "no-endpoints", Concatenation: true,
		KeyType: serviceIPs.KeyType,
	}
	return serviceIPs, nodePorts, noEndpoints
}

// addBase adds what does not belong to one port: the shared sets with the
// elements of pl, and the chains the kernel's hooks enter the table by.
// The ports' chains must be in the batch before it.
func addBase(c *nftables.Conn, t *nftables.Table, f *family, pl plan) error {
	serviceIPs, nodePorts, noEndpoints := sharedSets(t, f)
	protocolReg, portReg := f.keyRegisters()
	// daddr . meta l4proto . th dport
	key := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.daddr, Len: f.addrLen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: protocolReg},
		&expr.Payload{DestRegister: portReg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
	ipElems, noEndpointElems, nodePortElems := elements(pl.serviceIPs, pl.nodePorts)
	if err := addSet(c, serviceIPs, ipElems); err != nil {
		return err
	}
	if err := addSet(c, nodePorts, nodePortElems); err != nil {
		return err
	}
	if err := addSet(c, noEndpoints, noEndpointElems); err != nil {
		return err
	}
	// A Service without endpoints refuses at once, wherever the
	// connection comes from, instead of letting it time out. (Reject is
	// not allowed in the NAT chains that pick endpoints.) TCP gets a
	// reset: the kernel drops an ICMPv6 error that reaches a socket still
	// held by connect (LockDroppedIcmps), as it does when the whole round
	// trip runs within the send (the node's own connections, a pod's over
	// its veth), and the refusal came only with the SYN sent again a
	// second later.
	for _, hook := range []struct {
		name string
		hook *nftables.ChainHook
	}{{"filter-input", nftables.ChainHookInput}, {"filter-forward", nftables.ChainHookForward}, {"filter-output", nftables.ChainHookOutput}} {
		ch := c.AddChain(&nftables.Chain{Name: hook.name, Table: t, Type: nftables.ChainTypeFilter, Hooknum: hook.hook, Priority: nftables.ChainPriorityFilter})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(slices.Clip(key),
			&expr.Lookup{SourceRegister: 1, SetName: noEndpoints.Name, SetID: noEndpoints.ID},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
		)})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(slices.Clip(key),
			&expr.Lookup{SourceRegister: 1, SetName: noEndpoints.Name, SetID: noEndpoints.ID},
			&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: f.portUnreachable},
		)})
	}
	services := c.AddChain(&nftables.Chain{Name: "services", Table: t})
	// ip daddr . meta l4proto . th dport vmap @service-ips
	c.AddRule(&nftables.Rule{Table: t, Chain: services, Exprs: append(slices.Clip(key),
		&expr.Lookup{SourceRegister: 1, SetName: serviceIPs.Name, SetID: serviceIPs.ID, IsDestRegSet: true, DestRegister: 0},
	)})
	// fib daddr type local meta l4proto . th dport vmap @service-nodeports
	c.AddRule(&nftables.Rule{Table: t, Chain: services, Exprs: append(fibLocal(true),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: nodePorts.Name, SetID: nodePorts.ID, IsDestRegSet: true, DestRegister: 0},
	)})
	// Incoming packets and the host's own both pass through the services.
	for _, hook := range []struct {
		name string
		hook *nftables.ChainHook
	}{{"prerouting", nftables.ChainHookPrerouting}, {"output", nftables.ChainHookOutput}} {
		ch := c.AddChain(&nftables.Chain{Name: hook.name, Table: t, Type: nftables.ChainTypeNAT, Hooknum: hook.hook, Priority: nftables.ChainPriorityNATDest})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Verdict{Kind: expr.VerdictJump, Chain: services.Name},
		}})
	}
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(masqMark), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		&expr.Masq{},
	}})
	return nil
}

// elements are the elements of the shared sets for keys of a plan's
// serviceIPs (ips) and nodePorts: those of service-ips, of no-endpoints
// (keys of ips to "") and of service-nodeports.
func elements(ips, nodePorts map[string]string) (ipElems, noEndpointElems, nodePortElems []nftables.SetElement) {
	goTo := func(key, chain string) nftables.SetElement {
		return nftables.SetElement{Key: []byte(key), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}
	}
	for k, chain := range ips {
		if chain == "" {
			noEndpointElems = append(noEndpointElems, nftables.SetElement{Key: []byte(k)})
		} else {
			ipElems = append(ipElems, goTo(k, chain))
		}
	}
	for k, chain := range nodePorts {
		nodePortElems = append(nodePortElems, goTo(k, chain))
	}
	// In the order of their keys: the same ports make the same batch.
	for _, elems := range [][]nftables.SetElement{ipElems, noEndpointElems, nodePortElems} {
		slices.SortFunc(elems, func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
	}
	return ipElems, noEndpointElems, nodePortElems
}

// portName names a port across syncs; its chains and maps are named
// after it. A Service port is its ClusterIP, protocol and port; a hostPort
// is where on the node it listens and the pod it leads to.
func portName(p Port) string {
	if p.ClusterIP.IsValid() {
		return fmt.Sprintf("svc-%s-%d-%d", p.ClusterIP, p.Protocol, p.Port)
	}
	parts := []string{"hostport", fmt.Sprint(p.Protocol), fmt.Sprint(p.NodePort), fmt.Sprint(p.Port)}
	for _, ip := range p.ExternalIPs {
		parts = append(parts, ip.String())
	}
	for _, ep := range p.Endpoints {
		parts = append(parts, ep.String())
	}
	return strings.Join(parts, "-")
}

// targets names the chains of port name that traffic enters: internal
// from inside the cluster, external to its NodePort and external
// addresses. Either is empty where there is no endpoint to go to.
func targets(name string, p Port) (internal, external string) {
	if len(p.Endpoints) > 0 {
		internal = name
	}
	switch {
	case !p.ExternalLocal:
		return internal, internal
	case internal == "" && len(p.LocalEndpoints) == 0:
		return "", ""
	}
	return internal, name + "-ext"
}

// object is a chain of the table with its rules, or a set with its
// elements.
type object struct {
	chain *nftables.Chain
	rules [][]expr.Any
	set   *nftables.Set
	elems []nftables.SetElement
}

// portObjects is the one description of what the table holds for a port
// named name (see targets): its chains and its own sets, in the order they
// can be added, each after those it refers to.
func portObjects(t *nftables.Table, f *family, name string, clusterCIDR netip.Prefix, p Port) []object {
	var objs []object
	// One chain per endpoint, shared by both paths.
	epChains := map[netip.AddrPort]endpointChain{}
	for _, ep := range append(slices.Clone(p.Endpoints), p.LocalEndpoints...) {
		if _, ok := epChains[ep]; ok {
			continue
		}
		ec := endpointChain{name: name + "-ep-" + ep.String()}
		if p.Affinity > 0 {
			ec.affinity = &nftables.Set{Table: t, Name: affinitySetName(p, ep), KeyType: f.addrType, HasTimeout: true, Dynamic: true, Timeout: p.Affinity}
			objs = append(objs, object{set: ec.affinity})
		}
		objs = append(objs, endpointObject(t, f, ec, p, ep))
		epChains[ep] = ec
	}
	internal, external := targets(name, p)
	if internal != "" {
		// ip saddr != clusterCIDR: mark for masquerade, so replies come
		// back through this node.
		head := [][]expr.Any{append(inCIDR(f, clusterCIDR, expr.CmpOpNeq), setMark()...)}
		objs = append(objs, pickObjects(t, f, internal, head, p.Endpoints, epChains)...)
	}
	if external == internal {
		return objs
	}
	// Pods and the node itself are inside the cluster: for them the
	// Service behaves as usual.
	var toInternal expr.Any = &expr.Verdict{Kind: expr.VerdictDrop}
	if internal != "" {
		toInternal = &expr.Verdict{Kind: expr.VerdictGoto, Chain: internal}
	}
	head := [][]expr.Any{
		append(inCIDR(f, clusterCIDR, expr.CmpOpEq), toInternal),
		append(fibLocal(false), toInternal),
	}
	if len(p.LocalEndpoints) == 0 {
		ch := &nftables.Chain{Name: external, Table: t}
		return append(objs, object{chain: ch, rules: append(head, []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}})})
	}
	return append(objs, pickObjects(t, f, external, head, p.LocalEndpoints, epChains)...)
}

// addObjects adds objs to the batch of c, leaving out the sets in keep
// (they are in the table already); a set gets the entries carried over for
// it besides its own elements.
func addObjects(c *nftables.Conn, objs []object, carried map[string][]nftables.SetElement, keep map[string]bool) error {
	for _, o := range objs {
		if o.set != nil {
			if keep[o.set.Name] {
				continue
			}
			if err := addSet(c, o.set, append(slices.Clip(o.elems), carried[o.set.Name]...)); err != nil {
				return err
			}
			continue
		}
		ch := c.AddChain(o.chain)
		for _, r := range o.rules {
			c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: r})
		}
	}
	return nil
}

// addSet adds s with elems to the batch of c.
func addSet(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement) error {
	if err := c.AddSet(s, nil); err != nil {
		return fmt.Errorf("add nftables set %s: %w", s.Name, err)
	}
	return changeElements(c.SetAddElements, s, elems)
}

// elementBytes bounds the elements sent in one message: the kernel reads
// the length of their list, one netlink attribute, as 16 bits, and takes
// a longer one for garbage (1,000 Services overflowed service-ips).
const elementBytes = 32 << 10

// changeElements adds (or deletes) elems of s, in messages of at most
// elementBytes each.
func changeElements(change func(*nftables.Set, []nftables.SetElement) error, s *nftables.Set, elems []nftables.SetElement) error {
	for len(elems) > 0 {
		n, size := 0, 0
		for ; n < len(elems); n++ {
			// A generous bound on the attributes around the key and the
			// verdict.
			size += 96 + len(elems[n].Key)
			if v := elems[n].VerdictData; v != nil {
				size += len(v.Chain)
			}
			if n > 0 && size > elementBytes {
				break
			}
		}
		if err := change(s, elems[:n]); err != nil {
			return fmt.Errorf("change elements of nftables set %s: %w", s.Name, err)
		}
		elems = elems[n:]
	}
	return nil
}

// endpointChain is the chain that DNATs to one endpoint, and the set of
// clients that stick to it (nil without session affinity).
type endpointChain struct {
	name     string
	affinity *nftables.Set
}

// pickObjects are a chain that starts with head and ends with the choice
// of an endpoint, the one a client sticks to, else one at random; and its
// map of endpoints, before it.
func pickObjects(t *nftables.Table, f *family, name string, head [][]expr.Any, eps []netip.AddrPort, epChains map[netip.AddrPort]endpointChain) []object {
	// A named map, not an anonymous one: the kernel binds each anonymous
	// set by walking the whole pending batch, which made a table of 1,000
	// Services take seconds.
	// Sized, not constant: the kernel then picks as fast a map, and a
	// constant set takes its elements in one message only, too short for
	// many endpoints (see elementBytes).
	vmap := &nftables.Set{Table: t, Name: name + "-endpoints", Size: uint32(len(eps)), IsMap: true, KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict}
	rules := slices.Clone(head)
	var elems []nftables.SetElement
	for i, ep := range eps {
		ec := epChains[ep]
		if ec.affinity != nil {
			// ip saddr @affinity goto endpoint
			rules = append(rules, []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddr, Len: f.addrLen},
				&expr.Lookup{SourceRegister: 1, SetName: ec.affinity.Name},
				&expr.Verdict{Kind: expr.VerdictGoto, Chain: ec.name},
			})
		}
		elems = append(elems, nftables.SetElement{
			Key:         binaryutil.NativeEndian.PutUint32(uint32(i)),
			VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: ec.name},
		})
	}
	// numgen random mod N vmap { 0: goto ep-0, … }
	rules = append(rules, []expr.Any{
		&expr.Numgen{Register: 1, Modulus: uint32(len(eps)), Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: 1, SetName: vmap.Name, IsDestRegSet: true, DestRegister: 0},
	})
	return []object{{set: vmap, elems: elems}, {chain: &nftables.Chain{Name: name, Table: t}, rules: rules}}
}

// endpointObject DNATs to one endpoint, and remembers the client for
// session affinity; a pod reaching itself through its Service is
// masqueraded, or its reply would skip the DNAT.
func endpointObject(t *nftables.Table, f *family, ec endpointChain, p Port, ep netip.AddrPort) object {
	addr := ep.Addr().AsSlice()
	rules := [][]expr.Any{append([]expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddr, Len: f.addrLen},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr},
	}, setMark()...)}
	if ec.affinity != nil {
		// update @affinity { ip saddr }
		rules = append(rules, []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddr, Len: f.addrLen},
			&expr.Dynset{SrcRegKey: 1, SetName: ec.affinity.Name, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE), Timeout: p.Affinity},
		})
	}
	rules = append(rules, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p.Protocol}},
		&expr.Immediate{Register: 1, Data: addr},
		&expr.Immediate{Register: 2, Data: port(ep.Port())[:2]},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: f.nat, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	})
	return object{chain: &nftables.Chain{Name: ec.name, Table: t}, rules: rules}
}

// affinitySetName names the clients sticking to ep by the Service port and
// the endpoint, so that they carry over from one table to the next.
func affinitySetName(p Port, ep netip.AddrPort) string {
	return fmt.Sprintf("affinity-%s-%d-%d-%s", p.ClusterIP, p.Protocol, p.Port, ep)
}

// affinityEntries reads the clients in the current table's affinity sets,
// each with the time it has left; nothing on a fresh host.
func affinityEntries(c *nftables.Conn, t *nftables.Table) map[string][]nftables.SetElement {
	sets, err := c.GetSets(t)
	if err != nil {
		return nil
	}
	return entriesOf(c, slices.DeleteFunc(sets, func(s *nftables.Set) bool { return !strings.HasPrefix(s.Name, "affinity-") }))
}

// entriesOf reads the clients in affinity sets, each with the time it has
// left. A set it cannot read starts empty: clients then pick anew.
func entriesOf(c *nftables.Conn, sets []*nftables.Set) map[string][]nftables.SetElement {
	out := map[string][]nftables.SetElement{}
	for _, s := range sets {
		elems, err := c.GetSetElements(s)
		if err != nil {
			log.WithError(err).WithField("set", s.Name).Debug("could not read session affinity entries")
			continue
		}
		for _, e := range elems {
			if e.Expires > 0 {
				out[s.Name] = append(out[s.Name], nftables.SetElement{Key: e.Key, Timeout: e.Expires})
			}
		}
	}
	return out
}

// inCIDR is `ip saddr [!=] prefix` (ip6 saddr in the IPv6 table).
func inCIDR(f *family, prefix netip.Prefix, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddr, Len: f.addrLen},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: f.addrLen, Mask: prefixMask(prefix), Xor: make([]byte, f.addrLen)},
		&expr.Cmp{Op: op, Register: 1, Data: prefix.Masked().Addr().AsSlice()},
	}
}

// fibLocal is `fib daddr type local`, or `fib saddr type local`: an
// address of this node.
func fibLocal(daddr bool) []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: daddr, FlagSADDR: !daddr, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// setMark is `meta mark set meta mark | masqMark`.
func setMark() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^uint32(masqMark)),
			Xor:  binaryutil.NativeEndian.PutUint32(masqMark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}
}

func prefixMask(p netip.Prefix) []byte {
	return net.CIDRMask(p.Bits(), p.Addr().BitLen())
}

// port is a transport port in network order, padded to a register.
func port(p uint16) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint16(b, p)
	return b
}

// concat pads each field of a concatenated set key to 4 bytes.
func concat(fields ...[]byte) []byte {
	var out []byte
	for _, f := range fields {
		padded := make([]byte, (len(f)+3)/4*4)
		copy(padded, f)
		out = append(out, padded...)
	}
	return out
}
