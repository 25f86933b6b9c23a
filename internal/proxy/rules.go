package proxy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Table is the proxy's nftables table; `kelp killall` removes it.
const Table = "kelp-proxy"

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

// Apply replaces the proxy's table with one programming ports, in a single
// netlink batch: packets see the old rules or the new, never a mix.
// Session affinity entries of the old table carry over to the new.
func Apply(c *nftables.Conn, clusterCIDR netip.Prefix, ports []Port) error {
	t := &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4}
	affinity := affinityEntries(c, t)
	c.AddTable(t) // so that the delete cannot fail on a fresh host
	c.DelTable(t)
	c.AddTable(t)
	serviceIPs := &nftables.Set{
		Table: t, Name: "service-ips", IsMap: true, Concatenation: true,
		KeyType:  nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService),
		DataType: nftables.TypeVerdict,
	}
	nodePorts := &nftables.Set{
		Table: t, Name: "service-nodeports", IsMap: true, Concatenation: true,
		KeyType:  nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService),
		DataType: nftables.TypeVerdict,
	}
	noEndpoints := &nftables.Set{
		Table: t, Name: "no-endpoints", Concatenation: true,
		KeyType: serviceIPs.KeyType,
	}
	var ipElems, nodePortElems, noEndpointElems []nftables.SetElement
	to := func(key []byte, chain string) {
		if chain == "" {
			noEndpointElems = append(noEndpointElems, nftables.SetElement{Key: key})
			return
		}
		ipElems = append(ipElems, nftables.SetElement{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}})
	}
	nodePortTaken := map[[2]uint16]bool{}
	for i, p := range ports {
		internal, external, err := addPortChains(c, t, fmt.Sprintf("svc-%d", i), clusterCIDR, p, affinity)
		if err != nil {
			return err
		}
		if p.ClusterIP.Is4() {
			to(concat(p.ClusterIP.AsSlice(), []byte{p.Protocol}, port(p.Port)), internal)
		}
		for _, ip := range p.ExternalIPs {
			if ip.Is4() {
				to(concat(ip.AsSlice(), []byte{p.Protocol}, port(p.Port)), external)
			}
		}
		// A port of the node serves one Service or pod: the first wins,
		// and Services come first.
		if p.NodePort != 0 && external != "" && !nodePortTaken[[2]uint16{uint16(p.Protocol), p.NodePort}] {
			nodePortTaken[[2]uint16{uint16(p.Protocol), p.NodePort}] = true
			nodePortElems = append(nodePortElems, nftables.SetElement{
				Key:         concat([]byte{p.Protocol}, port(p.NodePort)),
				VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: external},
			})
		}
	}
	if err := c.AddSet(serviceIPs, ipElems); err != nil {
		return fmt.Errorf("add nftables set: %w", err)
	}
	if err := c.AddSet(nodePorts, nodePortElems); err != nil {
		return fmt.Errorf("add nftables set: %w", err)
	}
	if err := c.AddSet(noEndpoints, noEndpointElems); err != nil {
		return fmt.Errorf("add nftables set: %w", err)
	}
	// A Service without endpoints refuses at once, wherever the
	// connection comes from, instead of letting it time out. (Reject is
	// not allowed in the NAT chains that pick endpoints.)
	for _, hook := range []struct {
		name string
		hook *nftables.ChainHook
	}{{"filter-input", nftables.ChainHookInput}, {"filter-forward", nftables.ChainHookForward}, {"filter-output", nftables.ChainHookOutput}} {
		ch := c.AddChain(&nftables.Chain{Name: hook.name, Table: t, Type: nftables.ChainTypeFilter, Hooknum: hook.hook, Priority: nftables.ChainPriorityFilter})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
			&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: noEndpoints.Name, SetID: noEndpoints.ID},
			&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3}, // port unreachable
		}})
	}
	services := c.AddChain(&nftables.Chain{Name: "services", Table: t})
	// ip daddr . meta l4proto . th dport vmap @service-ips
	c.AddRule(&nftables.Rule{Table: t, Chain: services, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
		&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: serviceIPs.Name, SetID: serviceIPs.ID, IsDestRegSet: true, DestRegister: 0},
	}})
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
	if err := c.Flush(); err != nil {
		return fmt.Errorf("program nftables table %s: %w", Table, err)
	}
	return nil
}

// addPortChains adds the chains of one port: internal for traffic from
// inside the cluster, external for traffic to its NodePort and external
// addresses. Either name is empty where there is no endpoint to go to.
func addPortChains(c *nftables.Conn, t *nftables.Table, name string, clusterCIDR netip.Prefix, p Port, affinity map[string][]nftables.SetElement) (internal, external string, err error) {
	// One chain per endpoint, shared by both paths.
	epChains := map[netip.AddrPort]endpointChain{}
	for _, ep := range append(slices.Clone(p.Endpoints), p.LocalEndpoints...) {
		if _, ok := epChains[ep]; ok {
			continue
		}
		ec := endpointChain{name: fmt.Sprintf("%s-ep-%d", name, len(epChains))}
		if p.Affinity > 0 {
			ec.affinity = &nftables.Set{Table: t, Name: affinitySetName(p, ep), KeyType: nftables.TypeIPAddr, HasTimeout: true, Dynamic: true, Timeout: p.Affinity}
			if err := c.AddSet(ec.affinity, affinity[ec.affinity.Name]); err != nil {
				return "", "", fmt.Errorf("add nftables set: %w", err)
			}
		}
		addEndpointChain(c, t, ec, p, ep)
		epChains[ep] = ec
	}
	if len(p.Endpoints) > 0 {
		internal = name
		ch := c.AddChain(&nftables.Chain{Name: internal, Table: t})
		// ip saddr != clusterCIDR: mark for masquerade, so replies come
		// back through this node.
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(inCIDR(clusterCIDR, expr.CmpOpNeq), setMark()...)})
		addPick(c, t, ch, p.Endpoints, epChains)
	}
	if !p.ExternalLocal {
		return internal, internal, nil
	}
	if internal == "" && len(p.LocalEndpoints) == 0 {
		return "", "", nil
	}
	external = name + "-ext"
	ch := c.AddChain(&nftables.Chain{Name: external, Table: t})
	// Pods and the node itself are inside the cluster: for them the
	// Service behaves as usual.
	toInternal := &expr.Verdict{Kind: expr.VerdictDrop}
	if internal != "" {
		toInternal = &expr.Verdict{Kind: expr.VerdictGoto, Chain: internal}
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(inCIDR(clusterCIDR, expr.CmpOpEq), toInternal)})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(fibLocal(false), toInternal)})
	if len(p.LocalEndpoints) == 0 {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}})
	} else {
		addPick(c, t, ch, p.LocalEndpoints, epChains)
	}
	return internal, external, nil
}

// endpointChain is the chain that DNATs to one endpoint, and the set of
// clients that stick to it (nil without session affinity).
type endpointChain struct {
	name     string
	affinity *nftables.Set
}

// addPick ends ch with the choice of an endpoint: the one a client sticks
// to, else one at random.
func addPick(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain, eps []netip.AddrPort, epChains map[netip.AddrPort]endpointChain) {
	// A named map, not an anonymous one: the kernel binds each anonymous
	// set by walking the whole pending batch, which made a table of 1,000
	// Services take seconds.
	vmap := &nftables.Set{Table: t, Name: ch.Name + "-endpoints", Constant: true, IsMap: true, KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict}
	var elems []nftables.SetElement
	for i, ep := range eps {
		ec := epChains[ep]
		if ec.affinity != nil {
			// ip saddr @affinity goto endpoint
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
				&expr.Lookup{SourceRegister: 1, SetName: ec.affinity.Name, SetID: ec.affinity.ID},
				&expr.Verdict{Kind: expr.VerdictGoto, Chain: ec.name},
			}})
		}
		elems = append(elems, nftables.SetElement{
			Key:         binaryutil.NativeEndian.PutUint32(uint32(i)),
			VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: ec.name},
		})
	}
	// Errors of the set surface at Flush.
	_ = c.AddSet(vmap, elems)
	// numgen random mod N vmap { 0: goto ep-0, … }
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Numgen{Register: 1, Modulus: uint32(len(eps)), Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: 1, SetName: vmap.Name, SetID: vmap.ID, IsDestRegSet: true, DestRegister: 0},
	}})
}

// addEndpointChain DNATs to one endpoint, and remembers the client for
// session affinity; a pod reaching itself through its Service is
// masqueraded, or its reply would skip the DNAT.
func addEndpointChain(c *nftables.Conn, t *nftables.Table, ec endpointChain, p Port, ep netip.AddrPort) {
	ch := c.AddChain(&nftables.Chain{Name: ec.name, Table: t})
	addr := ep.Addr().AsSlice()
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append([]expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr},
	}, setMark()...)})
	if ec.affinity != nil {
		// update @affinity { ip saddr }
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Dynset{SrcRegKey: 1, SetName: ec.affinity.Name, SetID: ec.affinity.ID, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE), Timeout: p.Affinity},
		}})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p.Protocol}},
		&expr.Immediate{Register: 1, Data: addr},
		&expr.Immediate{Register: 2, Data: port(ep.Port())[:2]},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}})
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
	out := map[string][]nftables.SetElement{}
	for _, s := range sets {
		if !strings.HasPrefix(s.Name, "affinity-") {
			continue
		}
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

// inCIDR is `ip saddr [!=] prefix`.
func inCIDR(prefix netip.Prefix, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: prefixMask(prefix), Xor: make([]byte, 4)},
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
	m := make([]byte, 4)
	binary.BigEndian.PutUint32(m, ^uint32(0)<<(32-p.Bits()))
	return m
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
