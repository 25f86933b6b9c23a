package netpol

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Table is the nftables table of network policy enforcement, of family
// inet: one table sees both families, so a pod's rules are stated once
// for its IPv4 and its IPv6 address, programmed in one batch, and a pod
// that is isolated is isolated for both. `kelp killall` removes it.
const Table = "kelp-netpol"

// legacyTable is the table of kelps before dual-stack, family ip of the
// same name: the first Apply of a node upgraded from one removes it.
var legacyTable = &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4}

// family is what rules need to know of one address family.
type family struct {
	suffix                   string // of its sets' names: IPv4 "4", IPv6 "6"
	nfproto                  byte   // meta nfproto
	keyType                  nftables.SetDatatype
	saddrOffset, daddrOffset uint32 // in its network header
	addrLen                  uint32
}

var (
	ipv4 = family{suffix: "4", nfproto: unix.NFPROTO_IPV4, keyType: nftables.TypeIPAddr, saddrOffset: 12, daddrOffset: 16, addrLen: 4}
	ipv6 = family{suffix: "6", nfproto: unix.NFPROTO_IPV6, keyType: nftables.TypeIP6Addr, saddrOffset: 8, daddrOffset: 24, addrLen: 16}
	// families are in the order their sets and rules are made.
	families = []family{ipv4, ipv6}
)

func familyOf(ip netip.Addr) family {
	if ip.Is4() {
		return ipv4
	}
	return ipv6
}

// match is `meta nfproto F`: the payload of an address is read only from
// a packet of its family.
func (f family) match() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}},
	}
}

// direction is one side of the Ruleset: its chains are reached by the
// address of their pods at one end of a packet, the peers being at the
// other.
type direction struct {
	name    string // of its verdict maps, "<name>-pods4" and "-pods6", and chains, "<name>-<i>"
	podsEnd func(family) uint32
	chains  func(Ruleset) []Chain
}

// directions are in the order the base chain checks them.
var directions = []direction{
	{name: "egress", podsEnd: func(f family) uint32 { return f.saddrOffset }, chains: func(r Ruleset) []Chain { return r.Egress }},
	{name: "ingress", podsEnd: func(f family) uint32 { return f.daddrOffset }, chains: func(r Ruleset) []Chain { return r.Ingress }},
}

// peersEnd is the offset of the peers' address: the other end.
func (d direction) peersEnd(f family) uint32 {
	if d.podsEnd(f) == f.saddrOffset {
		return f.daddrOffset
	}
	return f.saddrOffset
}

func (d direction) chainName(i int) string {
	return fmt.Sprintf("%s-%d", d.name, i)
}

func (d direction) mapName(f family) string {
	return d.name + "-pods" + f.suffix
}

// forwardRules is the number of rules of the base chain: established,
// address resolution, and a verdict map lookup per direction and family.
var forwardRules = 2 + len(directions)*len(families)

// Apply replaces the table with one that enforces r, in a single netlink
// batch: packets see the old rules or the new, never a mix.
func Apply(c *nftables.Conn, r Ruleset) error {
	return apply(c, r, false)
}

// apply is Apply, removing the legacy table in the same batch if
// dropLegacy: the upgraded node's pods are never without their policies.
func apply(c *nftables.Conn, r Ruleset, dropLegacy bool) error {
	t := &nftables.Table{Name: Table, Family: nftables.TableFamilyINet}
	c.AddTable(t) // so that the delete cannot fail on a fresh host
	c.DelTable(t)
	c.AddTable(t)
	if dropLegacy {
		c.AddTable(legacyTable)
		c.DelTable(legacyTable)
	}

	sets := peerSets{table: t, byRanges: map[string]*nftables.Set{}}
	maps := map[string]*nftables.Set{}
	for _, d := range directions {
		elems := map[family][]nftables.SetElement{}
		for i, ch := range d.chains(r) {
			name := d.chainName(i)
			chain := c.AddChain(&nftables.Chain{Name: name, Table: t})
			for _, rule := range ch.Rules {
				rules, err := sets.ruleExprs(c, rule, d)
				if err != nil {
					return err
				}
				for _, e := range rules {
					c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: e})
				}
			}
			c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}})
			for _, pod := range ch.Pods {
				f := familyOf(pod)
				elems[f] = append(elems[f], nftables.SetElement{
					Key:         pod.AsSlice(),
					VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: name},
				})
			}
		}
		for _, f := range families {
			vmap := &nftables.Set{Table: t, Name: d.mapName(f), IsMap: true, KeyType: f.keyType, DataType: nftables.TypeVerdict}
			if err := c.AddSet(vmap, elems[f]); err != nil {
				return fmt.Errorf("add nftables set: %w", err)
			}
			maps[vmap.Name] = vmap
		}
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
	// meta nfproto ipv6 meta l4proto ipv6-icmp icmpv6 type
	// {nd-neighbor-solicit, nd-neighbor-advert} accept: pods on one bridge
	// find each other's link addresses with ICMPv6 they forward to each
	// other, solicitations to multicast addresses no policy names. ARP,
	// its IPv4 counterpart, never reaches this hook. Router advertisements
	// and redirects meet the policies: only the node routes.
	c.AddRule(&nftables.Rule{Table: t, Chain: forward, Exprs: append(ipv6.match(),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{ndFirst}, ToData: []byte{ndLast}},
		&expr.Verdict{Kind: expr.VerdictAccept},
	)})
	// ip saddr vmap @egress-pods4, ip6 saddr vmap @egress-pods6, then the
	// same of daddr for ingress: a jump, as a packet between two pods of
	// the node must pass both.
	for _, d := range directions {
		for _, f := range families {
			m := maps[d.mapName(f)]
			c.AddRule(&nftables.Rule{Table: t, Chain: forward, Exprs: append(f.match(),
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: d.podsEnd(f), Len: f.addrLen},
				&expr.Lookup{SourceRegister: 1, SetName: m.Name, SetID: m.ID, IsDestRegSet: true, DestRegister: 0},
			)})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("program nftables table %s: %w", Table, err)
	}
	return nil
}

// The ICMPv6 types of address resolution (RFC 4861): neighbour
// solicitation and advertisement.
const (
	ndFirst = 135
	ndLast  = 136
)

// Remove deletes the table, and that of a kelp before dual-stack, if
// there are any.
func Remove(c *nftables.Conn) error {
	for _, t := range []*nftables.Table{{Name: Table, Family: nftables.TableFamilyINet}, legacyTable} {
		c.AddTable(t) // so that the delete cannot fail if it is gone
		c.DelTable(t)
	}
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
			n := 1 // the drop
			for _, rule := range ch.Rules {
				n += len(splitPeers(rule))
			}
			want[d.chainName(i)] = n
		}
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
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

// familyPeers are the peers of one family of a rule; no family and no
// peers: any peer, of either family.
type familyPeers struct {
	family *family
	peers  []Range
}

// splitPeers are the peers of r by family, one entry for each nftables
// rule r comes to.
func splitPeers(r Rule) []familyPeers {
	if len(r.Peers) == 0 {
		return []familyPeers{{}}
	}
	var out []familyPeers
	v4, v6 := byFamily(r.Peers)
	if len(v4) > 0 {
		out = append(out, familyPeers{family: &ipv4, peers: v4})
	}
	if len(v6) > 0 {
		out = append(out, familyPeers{family: &ipv6, peers: v6})
	}
	return out
}

// ruleExprs are the nftables rules of r in a chain of d, each `[meta
// nfproto F] [meta l4proto P] [th dport FIRST-LAST] [ip|ip6 saddr|daddr
// @peers] return`: return, not accept, so that a packet between two pods
// of the node allowed out of one still faces the other's ingress.
func (s peerSets) ruleExprs(c *nftables.Conn, r Rule, d direction) ([][]expr.Any, error) {
	var out [][]expr.Any
	for _, fp := range splitPeers(r) {
		var e []expr.Any
		if fp.family != nil {
			e = append(e, fp.family.match()...)
		}
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
		if fp.family != nil {
			set, err := s.get(c, *fp.family, fp.peers)
			if err != nil {
				return nil, err
			}
			e = append(e,
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: d.peersEnd(*fp.family), Len: fp.family.addrLen},
				&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID})
		}
		out = append(out, append(e, &expr.Verdict{Kind: expr.VerdictReturn}))
	}
	return out, nil
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

// get is the set of rs, ranges of family f.
func (s peerSets) get(c *nftables.Conn, f family, rs []Range) (*nftables.Set, error) {
	var key strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&key, "%s-%s,", r.First, r.Last)
	}
	if set, ok := s.byRanges[key.String()]; ok {
		return set, nil
	}
	set := &nftables.Set{Table: s.table, Name: fmt.Sprintf("peers%s-%d", f.suffix, len(s.byRanges)), KeyType: f.keyType, Interval: true}
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
