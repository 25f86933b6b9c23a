package config

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// maxRangeSize bounds an address range to as many addresses as a homelab's
// or a site's network ever gives Gateways; a Gateway's address is found by
// walking its range.
const maxRangeSize = 1 << 16

// AddressRange is a range of addresses of one family, both ends included.
type AddressRange struct {
	First, Last netip.Addr
}

// Contains says whether a is in r.
func (r AddressRange) Contains(a netip.Addr) bool {
	return a.BitLen() == r.First.BitLen() && r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0
}

func (r AddressRange) String() string {
	if r.First == r.Last {
		return r.First.String()
	}
	return r.First.String() + "-" + r.Last.String()
}

// overlaps says whether r and p share an address.
func (r AddressRange) overlaps(p netip.Prefix) bool {
	p = p.Masked()
	if p.Addr().BitLen() != r.First.BitLen() {
		return false
	}
	return p.Contains(r.First) || p.Contains(r.Last) || r.Contains(p.Addr())
}

// ParseAddressRanges parses flag's values: ranges separated by commas or
// given one by one, each first-last (192.168.1.240-192.168.1.250), a CIDR
// (all its addresses) or one address. None: nil.
func ParseAddressRanges(flag string, values []string) ([]AddressRange, error) {
	var out []AddressRange
	for _, item := range List(values) {
		r, err := parseAddressRange(item)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", flag, item, err)
		}
		for _, other := range out {
			if other.Contains(r.First) || other.Contains(r.Last) || r.Contains(other.First) {
				return nil, fmt.Errorf("%s: the ranges %s and %s overlap", flag, other, r)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

func parseAddressRange(s string) (AddressRange, error) {
	const want = "want first-last (e.g. 192.168.1.240-192.168.1.250), a CIDR or one address"
	var r AddressRange
	switch first, last, isRange := strings.Cut(s, "-"); {
	case isRange:
		var err1, err2 error
		r.First, err1 = netip.ParseAddr(strings.TrimSpace(first))
		r.Last, err2 = netip.ParseAddr(strings.TrimSpace(last))
		if err1 != nil || err2 != nil {
			return r, fmt.Errorf("not a range of addresses: %s", want)
		}
	case strings.Contains(s, "/"):
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return r, fmt.Errorf("not a CIDR: %s", want)
		}
		p = p.Masked()
		r.First = p.Addr()
		r.Last = lastOf(p)
	default:
		a, err := netip.ParseAddr(s)
		if err != nil {
			return r, fmt.Errorf("not an address: %s", want)
		}
		r.First, r.Last = a, a
	}
	switch {
	case r.First.Zone() != "" || r.Last.Zone() != "" || r.First.Is4In6() || r.Last.Is4In6():
		return r, fmt.Errorf("give plain IPv4 or IPv6 addresses, without zone or IPv4-in-IPv6 form")
	case r.First.BitLen() != r.Last.BitLen():
		return r, fmt.Errorf("its ends are of different families: give an IPv4 and an IPv6 range apart, separated by a comma")
	case r.Last.Less(r.First):
		return r, fmt.Errorf("its first address is after its last")
	case !r.First.IsGlobalUnicast() || !r.Last.IsGlobalUnicast():
		return r, fmt.Errorf("not unicast addresses of a network: give addresses of the nodes' network that nothing else uses")
	case rangeSize(r) > maxRangeSize:
		return r, fmt.Errorf("more than %d addresses: give a smaller range", maxRangeSize)
	}
	return r, nil
}

// lastOf is the last address of p.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// rangeSize counts r's addresses, up to maxRangeSize+1.
func rangeSize(r AddressRange) int {
	n := 1
	for a := r.First; a != r.Last && n <= maxRangeSize; a = a.Next() {
		n++
	}
	return n
}

// checkGatewayRanges checks s's Gateway address ranges against its other
// networks and addresses.
func checkGatewayRanges(s Server) error {
	if len(s.GatewayAddressRanges) == 0 {
		return nil
	}
	if s.Disable.Gateway {
		return fmt.Errorf("--gateway-address-range is for the built-in Gateway API, which --disable gateway turns off: drop one of them")
	}
	var errs []error
	for _, r := range s.GatewayAddressRanges {
		for _, p := range slices.Concat(s.ClusterCIDRs, s.ServiceCIDRs) {
			if r.overlaps(p) {
				errs = append(errs, fmt.Errorf("--gateway-address-range %s overlaps the cluster's range %s: give addresses of the nodes' network", r, p))
			}
		}
		for _, ip := range s.NodeIPs {
			if r.Contains(ip) {
				errs = append(errs, fmt.Errorf("--gateway-address-range %s holds this node's address %s: give addresses no machine uses", r, ip))
			}
		}
	}
	return errors.Join(errs...)
}
