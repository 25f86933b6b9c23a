package netpol

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/google/nftables"
)

func TestPrefixRange(t *testing.T) {
	for prefix, want := range map[string][]Range{
		"10.42.0.0/16":  ranges("10.42.0.0-10.42.255.255"),
		"10.42.3.7/24":  ranges("10.42.3.0-10.42.3.255"), // not canonical
		"192.0.2.1/32":  ranges("192.0.2.1"),
		"0.0.0.0/0":     ranges("0.0.0.0-255.255.255.255"),
		"128.0.0.0/1":   ranges("128.0.0.0-255.255.255.255"),
		"10.0.0.128/25": ranges("10.0.0.128-10.0.0.255"),
		"fd42::/56":     ranges("fd42::-fd42:0:0:ff:ffff:ffff:ffff:ffff"),
		"fd42::1/127":   ranges("fd42::-fd42::1"), // not canonical
		"fd42::7/128":   ranges("fd42::7"),
		"::/0":          ranges("::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
		"fd43::/113":    ranges("fd43::-fd43::7fff"),
	} {
		if got := prefixRange(netip.MustParsePrefix(prefix)); got != want[0] {
			t.Errorf("prefixRange(%s) = %v, want %v", prefix, got, want[0])
		}
	}
}

func TestMerge(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in, want []Range
	}{
		{"empty", nil, nil},
		{"disjoint, unsorted", ranges("10.0.0.9", "10.0.0.1"), ranges("10.0.0.1", "10.0.0.9")},
		{"adjacent", ranges("10.0.0.2", "10.0.0.1", "10.0.0.3-10.0.0.8"), ranges("10.0.0.1-10.0.0.8")},
		{"overlapping", ranges("10.0.0.1-10.0.0.5", "10.0.0.4-10.0.0.9"), ranges("10.0.0.1-10.0.0.9")},
		{"contained", ranges("10.0.0.0-10.0.0.255", "10.0.0.7", "10.0.0.3-10.0.0.4"), ranges("10.0.0.0-10.0.0.255")},
		{"duplicates", ranges("10.0.0.7", "10.0.0.7"), ranges("10.0.0.7")},
		{"up to the end", ranges("255.255.255.255", "0.0.0.0-255.255.255.254"), ranges("0.0.0.0-255.255.255.255")},
		{"one apart", ranges("10.0.0.1", "10.0.0.3"), ranges("10.0.0.1", "10.0.0.3")},
		{"IPv6", ranges("fd42::5-fd42::9", "fd42::1-fd42::4", "fd42::b"), ranges("fd42::1-fd42::9", "fd42::b")},
		// The last IPv4 address and the first IPv6 one are of two families.
		{"families stay apart", ranges("::", "fd42::1", "255.255.255.255", "10.0.0.1"), ranges("10.0.0.1", "255.255.255.255", "::", "fd42::1")},
	} {
		if got := merge(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: merge = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestIPBlockRanges(t *testing.T) {
	for _, tc := range []struct {
		cidr   string
		except []string
		want   []Range
		ok     bool
	}{
		{"10.0.0.0/8", nil, ranges("10.0.0.0-10.255.255.255"), true},
		{"10.0.0.0/8", []string{"10.42.0.0/16"}, ranges("10.0.0.0-10.41.255.255", "10.43.0.0-10.255.255.255"), true},
		{"10.0.0.0/8", []string{"10.0.0.0/9", "10.255.255.255/32"}, ranges("10.128.0.0-10.255.255.254"), true},
		{"10.0.0.0/24", []string{"10.0.0.0/24"}, nil, true},
		{"10.0.0.0/24", []string{"10.0.0.0/16"}, nil, true}, // invalid, but does what it says
		{"10.0.0.0/24", []string{"192.0.2.0/24", "fd00::/8"}, ranges("10.0.0.0-10.0.0.255"), true},
		{"0.0.0.0/0", []string{"10.0.0.0/8", "0.0.0.0/32"}, ranges("0.0.0.1-9.255.255.255", "11.0.0.0-255.255.255.255"), true},
		{"0.0.0.0/0", []string{"255.255.255.0/24"}, ranges("0.0.0.0-255.255.254.255"), true},
		{"fd00::/8", nil, ranges("fd00::-fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), true},
		{"fd42::/64", []string{"fd42::/120", "fd42::ffff:ffff:ffff:ff00/120", "10.0.0.0/8"}, ranges("fd42::100-fd42::ffff:ffff:ffff:feff"), true},
		{"::/0", []string{"fd42::/16"}, ranges("::-fd41:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fd43::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), true},
		{"fd42::/64", []string{"fd42::/129"}, nil, false},
		{"10.0.0.0/33", nil, nil, false},
		{"10.0.0.0/8", []string{"bogus"}, nil, false},
	} {
		got, ok := ipBlockRanges(tc.cidr, tc.except)
		if !reflect.DeepEqual(got, tc.want) || ok != tc.ok {
			t.Errorf("ipBlockRanges(%s except %v) = %v, %v; want %v, %v", tc.cidr, tc.except, got, ok, tc.want, tc.ok)
		}
	}
}

func TestIntervalElements(t *testing.T) {
	got := intervalElements(ranges("10.0.0.1", "10.0.1.0-10.0.1.255", "128.0.0.0-255.255.255.255"))
	want := []nftables.SetElement{
		{Key: []byte{10, 0, 0, 1}}, {Key: []byte{10, 0, 0, 2}, IntervalEnd: true},
		{Key: []byte{10, 0, 1, 0}}, {Key: []byte{10, 0, 2, 0}, IntervalEnd: true},
		// Open at the end of the address space: there is no address after it.
		{Key: []byte{128, 0, 0, 0}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("intervalElements = %+v, want %+v", got, want)
	}
	got = intervalElements(ranges("fd42::1-fd42::ff", "ffff::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))
	want = []nftables.SetElement{
		{Key: netip.MustParseAddr("fd42::1").AsSlice()}, {Key: netip.MustParseAddr("fd42::100").AsSlice(), IntervalEnd: true},
		{Key: netip.MustParseAddr("ffff::").AsSlice()},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("intervalElements of IPv6 = %+v, want %+v", got, want)
	}
}

func TestByFamily(t *testing.T) {
	for _, tc := range []struct {
		in, v4, v6 []Range
	}{
		{nil, nil, nil},
		{ranges("10.0.0.1", "10.0.0.5-10.0.0.9"), ranges("10.0.0.1", "10.0.0.5-10.0.0.9"), nil},
		{ranges("fd42::1"), nil, ranges("fd42::1")},
		{ranges("10.0.0.1", "::-::5", "fd42::1"), ranges("10.0.0.1"), ranges("::-::5", "fd42::1")},
	} {
		v4, v6 := byFamily(tc.in)
		if len(v4)+len(tc.v4) > 0 && !reflect.DeepEqual(v4, tc.v4) || len(v6)+len(tc.v6) > 0 && !reflect.DeepEqual(v6, tc.v6) {
			t.Errorf("byFamily(%v) = %v, %v; want %v, %v", tc.in, v4, v6, tc.v4, tc.v6)
		}
	}
}
