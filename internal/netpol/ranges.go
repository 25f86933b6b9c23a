package netpol

import (
	"encoding/binary"
	"net/netip"
	"slices"
)

// Range is the IPv4 addresses from First to Last, both included.
type Range struct {
	First, Last netip.Addr
}

// prefixRange is the range of the addresses in p, an IPv4 prefix.
func prefixRange(p netip.Prefix) Range {
	p = p.Masked()
	last := p.Addr().As4()
	binary.BigEndian.PutUint32(last[:], binary.BigEndian.Uint32(last[:])|^uint32(0)>>p.Bits())
	return Range{First: p.Addr(), Last: netip.AddrFrom4(last)}
}

// merge sorts rs and joins the ranges that overlap or touch: an nftables
// interval set refuses overlapping elements, and fewer elements are
// cheaper to hold. It reorders rs.
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

// ipBlockRanges are the IPv4 addresses of cidr outside every prefix of
// except, as disjoint sorted ranges. ok is false for a block that is not
// IPv4 or does not parse: such a block matches nothing, rather than more
// than the policy says.
func ipBlockRanges(cidr string, except []string) (rs []Range, ok bool) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() {
		return nil, false
	}
	rs = []Range{prefixRange(p)}
	for _, e := range except {
		ep, err := netip.ParsePrefix(e)
		if err != nil {
			return nil, false
		}
		if ep.Addr().Is4() {
			rs = subtract(rs, prefixRange(ep))
		}
	}
	return rs, true
}
