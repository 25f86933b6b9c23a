package config

import (
	"strings"
	"testing"
)

func TestGatewayAddressRange(t *testing.T) {
	s, err := runServer(t, "--gateway-address-range", "192.168.1.240-192.168.1.241,192.168.1.248/30", "--gateway-address-range", "2001:db8::f0")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range s.GatewayAddressRanges {
		got = append(got, r.String())
	}
	if want := "192.168.1.240-192.168.1.241 192.168.1.248-192.168.1.251 2001:db8::f0"; strings.Join(got, " ") != want {
		t.Errorf("ranges %q, want %q", got, want)
	}
	if s, err := runServer(t); err != nil || s.GatewayAddressRanges != nil {
		t.Errorf("default ranges %v (%v), want none", s.GatewayAddressRanges, err)
	}
}

func TestGatewayAddressRangeBadInput(t *testing.T) {
	for _, tc := range []struct {
		value []string
		want  string
	}{
		{[]string{"192.168.1.240-"}, "not a range of addresses"},
		{[]string{"192.168.1.0/33"}, "not a CIDR"},
		{[]string{"gateway.example"}, "not an address"},
		{[]string{"192.168.1.241-192.168.1.240"}, "its first address is after its last"},
		{[]string{"192.168.1.240-2001:db8::1"}, "different families"},
		{[]string{"224.0.0.1"}, "not unicast addresses"},
		{[]string{"10.0.0.0/8"}, "more than 65536 addresses"},
		{[]string{"192.168.1.240/29,192.168.1.244"}, "overlap"},
		{[]string{"10.42.1.0/28"}, "overlaps the cluster's range 10.42.0.0/16"},
		{[]string{"10.43.0.250-10.43.1.2"}, "overlaps the cluster's range 10.43.0.0/16"},
		{[]string{"192.168.1.9-192.168.1.11"}, "holds this node's address 192.168.1.10"},
		{[]string{"192.168.1.240", "--disable", "gateway"}, "--disable gateway turns off"},
	} {
		args := append([]string{"--gateway-address-range"}, tc.value...)
		if _, err := runServer(t, args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one saying %q", tc.value, err, tc.want)
		}
	}
}
