package netpol

import (
	"net/netip"
	"slices"
)

// Range is the addresses from First to Last, both included, of one family.
type Range struct {
	First, Last netip.Addr
}

// prefixRange is the range of the addresses in p.
func prefixRange(p netip.Prefix) Range {
	p = p.Masked()
	last := p.Addr().AsSlice()
	for i := p.Bits(); i < len(last)*8; i++ {
		last[i/8] |= 0x80 >> (i % 8)
	}
	addr, _ := netip.AddrFromSlice(last)
	return Range{First: p.Addr(), Last: addr}
}

// merge sorts rs and joins the ranges that overlap or touch: an nftables
// interval set refuses overlapping elements, and fewer elements are
// cheaper to hold. It reorders rs. IPv4 ranges sort before IPv6 ones, and
// a range of one family never joins one of the other.
func merge(rs []Range) []Range {
	slices.SortFunc(rs, func(a, b Range) int { return a.First.Compare(b.First) })
	var out []Range
	for _, r := range rs {
		if n := len(out); n > 0 && (r.First.Compare(out[n-1].Last) <= 0 || out[n-1].Last.Next() == r.First) {
			if r.Last.Compare(out[n-1].Last) > 0 {
				out[n-1].Last = r.Last
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// subtract removes cut from each of rs.
func subtract(rs []Range, cut Range) []Range {
	var out []Range
	for _, r := range rs {
		if cut.Last.Less(r.First) || r.Last.Less(cut.First) {
			out = append(out, r)
			continue
		}
		if r.First.Less(cut.First) {
			out = append(out, Range{First: r.First, Last: cut.First.Prev()})
		}
		if cut.Last.Less(r.Last) {
			out = append(out, Range{First: cut.Last.Next(), Last: r.Last})
		}
	}
	return out
}

// byFamily splits disjoint sorted ranges into their IPv4 and IPv6 ones.
func byFamily(rs []Range) (v4, v6 []Range) {
	i := slices.IndexFunc(rs, func(r Range) bool { return !r.First.Is4() })
	if i < 0 {
		i = len(rs)
	}
	return rs[:i:i], rs[i:]
}

// ipBlockRanges are the addresses of cidr, IPv4 or IPv6, outside every
// prefix of except, as disjoint sorted ranges. An except of the other
// family than cidr's holds none of its addresses. ok is false for a
// block that does not parse: such a block matches nothing, rather than
// more than the policy says.
func ipBlockRanges(cidr string, except []string) (rs []Range, ok bool) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, false
	}
	rs = []Range{prefixRange(p)}
	for _, e := range except {
		ep, err := netip.ParsePrefix(e)
		if err != nil {
			return nil, false
		}
		if ep.Addr().Is4() == p.Addr().Is4() {
			rs = subtract(rs, prefixRange(ep))
		}
	}
	return rs, true
}
