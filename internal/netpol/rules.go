package netpol

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
)

// Table is the nftables table of network policy enforcement; `kelp
// killall` removes it.
const Table = "kelp-netpol"

// Offsets in the IPv4 header.
const (
	saddrOffset = 12
	daddrOffset = 16
)

// direction is one side of the Ruleset: its chains are reached by the
// address of their pods at one end of a packet, the peers being at the
// other.
type direction struct {
	name        string // of its verdict map, "<name>-pods", and chains, "<name>-<i>"
	podOffset   uint32
	peersOffset uint32
	chains      func(Ruleset) []Chain
}

// directions are in the order the base chain checks them.
var directions = []direction{
	{name: "egress", podOffset: saddrOffset, peersOffset: daddrOffset, chains: func(r Ruleset) []Chain { return r.Egress }},
	{name: "ingress", podOffset: daddrOffset, peersOffset: saddrOffset, chains: func(r Ruleset) []Chain { return r.Ingress }},
}

func (d direction) chainName(i int) string {
	return fmt.Sprintf("%s-%d", d.name, i)
}

// forwardRules is the number of rules of the base chain.
const forwardRules = 3

// Apply replaces the table with one that enforces r, in a single netlink
// batch: packets see the old rules or the new, never a mix.
func Apply(c *nftables.Conn, r Ruleset) error {
	t := &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4}
	c.AddTable(t) // so that the delete cannot fail on a fresh host
	c.DelTable(t)
	c.AddTable(t)

	sets := peerSets{table: t, byRanges: map[string]*nftables.Set{}}
	var maps []*nftables.Set
	for _, d := range directions {
		var elems []nftables.SetElement
		for i, ch := range d.chains(r) {
			name := d.chainName(i)
			chain := c.AddChain(&nftables.Chain{Name: name, Table: t})
			for _, rule := range ch.Rules {
				set, err := sets.get(c, rule.Peers)
				if err != nil {
					return err
				}
				c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: ruleExprs(rule, d.peersOffset, set)})
			}
			c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}})
			for _, pod := range ch.Pods {
				elems = append(elems, nftables.SetElement{
					Key:         pod.AsSlice(),
					VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: name},
				})
			}
		}
		vmap := &nftables.Set{Table: t, Name: d.name + "-pods", IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
		if err := c.AddSet(vmap, elems); err != nil {
			return fmt.Errorf("add nftables set: %w", err)
		}
		maps = append(maps, vmap)
	}

	// Only forwarded packets are checked: the node's own traffic to and
	// from its pods (probes, the node-local DNS) is always allowed.
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	// ct state established,related accept: policies decide which
	// connections may start, and replies belong to one that did.
	c.AddRule(&nftables.Rule{Table: t, Chain: forward, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	// ip saddr vmap @egress-pods, then ip daddr vmap @ingress-pods: a
	// jump, as a packet between two pods of the node must pass both.
	for i, d := range directions {
		c.AddRule(&nftables.Rule{Table: t, Chain: forward, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: d.podOffset, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: maps[i].Name, SetID: maps[i].ID, IsDestRegSet: true, DestRegister: 0},
		}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("program nftables table %s: %w", Table, err)
	}
	return nil
}

// Remove deletes the table, if there is one.
func Remove(c *nftables.Conn) error {
	t := &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4}
	c.AddTable(t) // so that the delete cannot fail if it is gone
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove nftables table %s: %w", Table, err)
	}
	return nil
}

// intact reports whether the kernel still holds the chains Apply made for
// r, each with as many rules: a cheap sign nobody has changed the table.
func intact(c *nftables.Conn, r Ruleset) (bool, error) {
	want := map[string]int{"forward": forwardRules}
	for _, d := range directions {
		for i, ch := range d.chains(r) {
			want[d.chainName(i)] = len(ch.Rules) + 1 // and the drop
		}
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, fmt.Errorf("list nftables chains: %w", err)
	}
	found := 0
	for _, ch := range chains {
		if ch.Table.Name != Table {
			continue
		}
		n, ok := want[ch.Name]
		if !ok {
			return false, nil
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return false, fmt.Errorf("list rules of nftables chain %s: %w", ch.Name, err)
		}
		if len(rules) != n {
			return false, nil
		}
		found++
	}
	return found == len(want), nil
}

// ruleExprs are `[meta l4proto P] [th dport FIRST-LAST] [ip saddr|daddr
// @peers] return`: return, not accept, so that a packet between two pods
// of the node allowed out of one still faces the other's ingress.
func ruleExprs(r Rule, peersOffset uint32, peers *nftables.Set) []expr.Any {
	var e []expr.Any
	if r.Protocol != 0 {
		e = append(e,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{r.Protocol}})
	}
	if r.FirstPort != 0 {
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
		if r.FirstPort == r.LastPort {
			e = append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port(r.FirstPort)})
		} else {
			e = append(e, &expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: port(r.FirstPort), ToData: port(r.LastPort)})
		}
	}
	if peers != nil {
		e = append(e,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: peersOffset, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: peers.Name, SetID: peers.ID})
	}
	return append(e, &expr.Verdict{Kind: expr.VerdictReturn})
}

// port is a transport port in network order.
func port(p uint16) []byte {
	return binary.BigEndian.AppendUint16(nil, p)
}

// peerSets makes a named interval set for each distinct list of peers,
// shared by the rules that name the same peers.
type peerSets struct {
	table    *nftables.Table
	byRanges map[string]*nftables.Set
}

// get is the set of rs, nil for an empty rs (any peer).
func (s peerSets) get(c *nftables.Conn, rs []Range) (*nftables.Set, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	var key strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&key, "%s-%s,", r.First, r.Last)
	}
	if set, ok := s.byRanges[key.String()]; ok {
		return set, nil
	}
	set := &nftables.Set{Table: s.table, Name: fmt.Sprintf("peers-%d", len(s.byRanges)), KeyType: nftables.TypeIPAddr, Interval: true}
	if err := c.AddSet(set, intervalElements(rs)); err != nil {
		return nil, fmt.Errorf("add nftables set: %w", err)
	}
	s.byRanges[key.String()] = set
	return set, nil
}

// intervalElements encode disjoint sorted ranges as an interval set does:
// each starts with its first address and ends at the address after its
// last, unless it runs to the end of the address space.
func intervalElements(rs []Range) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: r.First.AsSlice()})
		if end := r.Last.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}
