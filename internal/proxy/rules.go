package proxy

import (
	"encoding/binary"
	"fmt"
	"net/netip"

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
	Endpoints   []netip.AddrPort
}

// Apply replaces the proxy's table with one programming ports, in a single
// netlink batch: packets see the old rules or the new, never a mix.
func Apply(c *nftables.Conn, clusterCIDR netip.Prefix, ports []Port) error {
	t := &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4}
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
	nodePortTaken := map[[2]uint16]bool{}
	for i, p := range ports {
		var keys [][]byte
		for _, ip := range append([]netip.Addr{p.ClusterIP}, p.ExternalIPs...) {
			if ip.Is4() {
				keys = append(keys, concat(ip.AsSlice(), []byte{p.Protocol}, port(p.Port)))
			}
		}
		if len(p.Endpoints) == 0 {
			for _, key := range keys {
				noEndpointElems = append(noEndpointElems, nftables.SetElement{Key: key})
			}
			continue
		}
		chain := fmt.Sprintf("svc-%d", i)
		addServiceChain(c, t, chain, clusterCIDR, p)
		for _, key := range keys {
			ipElems = append(ipElems, nftables.SetElement{
				Key:         key,
				VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain},
			})
		}
		// A port of the node serves one Service or pod: the first wins,
		// and Services come first.
		if p.NodePort != 0 && !nodePortTaken[[2]uint16{uint16(p.Protocol), p.NodePort}] {
			nodePortTaken[[2]uint16{uint16(p.Protocol), p.NodePort}] = true
			nodePortElems = append(nodePortElems, nftables.SetElement{
				Key:         concat([]byte{p.Protocol}, port(p.NodePort)),
				VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain},
			})
		}
	}
	if err := c.AddSet(serviceIPs, ipElems); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	if err := c.AddSet(nodePorts, nodePortElems); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	if err := c.AddSet(noEndpoints, noEndpointElems); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	// A Service without ready endpoints refuses at once, wherever the
	// connection comes from, instead of letting it time out.
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
	c.AddRule(&nftables.Rule{Table: t, Chain: services, Exprs: []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: nodePorts.Name, SetID: nodePorts.ID, IsDestRegSet: true, DestRegister: 0},
	}})
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
		return fmt.Errorf("proxy: program nftables table %s: %w", Table, err)
	}
	return nil
}

// addServiceChain adds the chain of one Service port: mark what needs
// masquerade, then pick an endpoint at random.
func addServiceChain(c *nftables.Conn, t *nftables.Table, name string, clusterCIDR netip.Prefix, p Port) {
	ch := c.AddChain(&nftables.Chain{Name: name, Table: t})
	mask := prefixMask(clusterCIDR)
	// ip saddr != clusterCIDR: mark for masquerade, so replies come back
	// through this node.
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append([]expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: clusterCIDR.Masked().Addr().AsSlice()},
	}, setMark()...)})
	vmap := &nftables.Set{Table: t, Anonymous: true, Constant: true, IsMap: true, KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict}
	var elems []nftables.SetElement
	for i, ep := range p.Endpoints {
		epChain := fmt.Sprintf("%s-ep-%d", name, i)
		addEndpointChain(c, t, epChain, p.Protocol, ep)
		elems = append(elems, nftables.SetElement{
			Key:         binaryutil.NativeEndian.PutUint32(uint32(i)),
			VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: epChain},
		})
	}
	// Errors of an anonymous set surface at Flush.
	_ = c.AddSet(vmap, elems)
	// numgen random mod N vmap { 0: goto ep-0, … }
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Numgen{Register: 1, Modulus: uint32(len(p.Endpoints)), Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: 1, SetName: vmap.Name, SetID: vmap.ID, IsDestRegSet: true, DestRegister: 0},
	}})
}

// addEndpointChain DNATs to one endpoint; a pod reaching itself through
// its Service is masqueraded, or its reply would skip the DNAT.
func addEndpointChain(c *nftables.Conn, t *nftables.Table, name string, protocol uint8, ep netip.AddrPort) {
	ch := c.AddChain(&nftables.Chain{Name: name, Table: t})
	addr := ep.Addr().AsSlice()
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append([]expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr},
	}, setMark()...)})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{protocol}},
		&expr.Immediate{Register: 1, Data: addr},
		&expr.Immediate{Register: 2, Data: port(ep.Port())[:2]},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}})
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
