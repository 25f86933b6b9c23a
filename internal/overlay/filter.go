package overlay

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/nft"
)

// Table is the overlay's nftables table, of family inet, made with backend
// vxlan only. VXLAN carries neither authentication nor encryption, and the
// device takes any frame that reaches its port: without the table, any host
// that reaches a node could put packets with the source address of an
// allowed pod into the node's pod network, past its NetworkPolicies. The
// table drops VXLAN packets to this node from any address but the peers'
// node IPs, and its pods' VXLAN packets to peers, which would leave
// masqueraded to this node's address and be let in. Like the device, it
// stays when kelp stops; Remove and `kelp killall` delete it.
const Table = "kelp-overlay"

var table = &nftables.Table{Name: Table, Family: nftables.TableFamilyINet}

// sources are the addresses VXLAN packets are let in from, by family: all
// node IPs of peers, sorted, each once. Both families, not only the one
// VXLAN runs over, so that peers are not cut off while the cluster's
// primary family changes and they move their devices one by one.
func sources(peers []Peer) map[family][]netip.Addr {
	out := map[family][]netip.Addr{}
	for _, p := range peers {
		for _, ip := range p.IPs {
			out[familyOf(ip)] = append(out[familyOf(ip)], ip)
		}
	}
	for f, ips := range out {
		slices.SortFunc(ips, netip.Addr.Compare)
		out[f] = slices.Compact(ips)
	}
	return out
}

// guard makes the table one that lets VXLAN packets in from the node IPs
// of peers only. One that does already is left alone; any other is
// replaced in one netlink batch: packets meet the old peers or the new,
// never no filter.
func guard(peers []Peer) error {
	c, err := nft.New()
	if err != nil {
		return err
	}
	allowed := sources(peers)
	if ok, err := guarding(c, allowed); err == nil && ok {
		return nil
	}
	c.AddTable(table) // so that the delete cannot fail on a fresh host
	c.DelTable(table)
	c.AddTable(table)
	input := c.AddChain(&nftables.Chain{Name: "input", Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	// A pod's VXLAN packet to a peer is masqueraded to this node's
	// address on the way out: it must not get there.
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	for _, f := range []family{ipv4, ipv6} {
		h := headerOf(f)
		set := &nftables.Set{Table: table, Name: setName(f), KeyType: h.keyType}
		var elems []nftables.SetElement
		for _, ip := range allowed[f] {
			elems = append(elems, nftables.SetElement{Key: ip.AsSlice()})
		}
		if err := c.AddSet(set, elems); err != nil {
			return fmt.Errorf("add nftables set %s: %w", set.Name, err)
		}
		// meta nfproto F udp dport 8472 ip saddr != @peersF drop
		c.AddRule(&nftables.Rule{Table: table, Chain: input, Exprs: slices.Concat(h.vxlan(), h.notFrom(set))})
		// meta nfproto F udp dport 8472 ip daddr @peersF ip saddr != @peersF drop:
		// a node that routes between peers passes theirs on.
		c.AddRule(&nftables.Rule{Table: table, Chain: forward, Exprs: slices.Concat(h.vxlan(), h.to(set), h.notFrom(set))})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("program nftables table %s: %w (is nf_tables in the kernel? see `kelp check-config`)", Table, err)
	}
	return nil
}

// chainRules are the chains guard makes, with their number of rules: one
// per family.
var chainRules = map[string]int{"input": 2, "forward": 2}

// setName is the name of the set of peers' node IPs of family f.
func setName(f family) string {
	return fmt.Sprintf("peers%d", f)
}

// guarding says whether the table lets VXLAN in from the addresses of
// allowed: whether its sets hold them, and its chains as many rules as
// guard makes, a cheap sign that nobody changed those.
func guarding(c *nftables.Conn, allowed map[family][]netip.Addr) (bool, error) {
	chains, err := c.ListChainsOfTableFamily(table.Family)
	if err != nil {
		return false, fmt.Errorf("list nftables chains: %w", err)
	}
	found := 0
	for _, ch := range chains {
		if ch.Table.Name != Table {
			continue
		}
		rules, err := c.GetRules(table, ch)
		if err != nil {
			return false, fmt.Errorf("list rules of nftables chain %s: %w", ch.Name, err)
		}
		if n, ok := chainRules[ch.Name]; !ok || len(rules) != n {
			return false, nil
		}
		found++
	}
	if found != len(chainRules) {
		return false, nil
	}
	sets, err := c.GetSets(table)
	if err != nil {
		return false, fmt.Errorf("list nftables sets: %w", err)
	}
	if len(sets) != 2 {
		return false, nil
	}
	for _, set := range sets {
		f := map[string]family{setName(ipv4): ipv4, setName(ipv6): ipv6}[set.Name]
		if f == 0 {
			return false, nil
		}
		elems, err := c.GetSetElements(set)
		if err != nil {
			return false, fmt.Errorf("list elements of nftables set %s: %w", set.Name, err)
		}
		have := make([]netip.Addr, len(elems))
		for i, e := range elems {
			have[i], _ = netip.AddrFromSlice(e.Key)
		}
		slices.SortFunc(have, netip.Addr.Compare)
		if !slices.Equal(have, allowed[f]) {
			return false, nil
		}
	}
	return true, nil
}

// guardNew makes the table with no peers if there is none. The VXLAN
// device made at start would otherwise take frames from anyone until the
// peers are known; a table left by the kelp before keeps its peers, so
// that they are not cut off meanwhile.
func guardNew() error {
	c, err := nft.New()
	if err != nil {
		return err
	}
	tables, err := c.ListTablesOfFamily(table.Family)
	if err != nil {
		return fmt.Errorf("list nftables tables: %w (is nf_tables in the kernel? see `kelp check-config`)", err)
	}
	if slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == Table }) {
		return nil
	}
	return guard(nil)
}

// unguard deletes the table, if there is one.
func unguard() error {
	c, err := nft.New()
	if err != nil {
		return err
	}
	c.AddTable(table) // so that the delete cannot fail if it is gone
	c.DelTable(table)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove nftables table %s: %w", Table, err)
	}
	return nil
}

// header is where packets of one family hold what the table matches.
type header struct {
	nfproto            byte
	keyType            nftables.SetDatatype
	saddr, daddr, size uint32 // offsets and length of addresses in the network header
}

func headerOf(f family) header {
	if f == ipv6 {
		return header{nfproto: unix.NFPROTO_IPV6, keyType: nftables.TypeIP6Addr, saddr: 8, daddr: 24, size: 16}
	}
	return header{nfproto: unix.NFPROTO_IPV4, keyType: nftables.TypeIPAddr, saddr: 12, daddr: 16, size: 4}
}

// vxlan is `meta nfproto F meta l4proto udp udp dport 8472`.
func (h header) vxlan() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{h.nfproto}},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, vxlanPort)},
	}
}

// to is `ip daddr @set`.
func (h header) to(set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: h.daddr, Len: h.size},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

// notFrom is `ip saddr != @set drop`.
func (h header) notFrom(set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: h.saddr, Len: h.size},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}
