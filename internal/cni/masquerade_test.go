package cni

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	corev1 "k8s.io/api/core/v1"

	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

func TestMasqueradeRule(t *testing.T) {
	tests := []struct {
		cidr          string
		proto         byte
		src, dst, len uint32
		mask          []byte
	}{
		{"10.42.0.0/16", 2 /* NFPROTO_IPV4 */, 12, 16, 4, []byte{255, 255, 0, 0}},
		{"fd42::/56", 10 /* NFPROTO_IPV6 */, 8, 24, 16, []byte{255, 255, 255, 255, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.cidr, func(t *testing.T) {
			cidr := netip.MustParsePrefix(tt.cidr)
			network := cidr.Addr().AsSlice()
			want := []expr.Any{
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{tt.proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: tt.src, Len: tt.len},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: tt.len, Mask: tt.mask, Xor: make([]byte, tt.len)},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: network},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: tt.dst, Len: tt.len},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: tt.len, Mask: tt.mask, Xor: make([]byte, tt.len)},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: network},
				&expr.Masq{FullyRandom: true},
			}
			if got := masquerade(cidr); !reflect.DeepEqual(got, want) {
				t.Errorf("rule for %s:\n got %#v\nwant %#v", cidr, got, want)
			}
		})
	}
}

// TestEnsureMasquerade programs the table in a network namespace of its
// own: one inet table with a rule per family, which replaces the IPv4
// table of an earlier kelp and itself on every start.
func TestEnsureMasquerade(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		c, err := nft.New()
		if err != nil {
			t.Fatal(err)
		}
		old := c.AddTable(&nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4})
		c.AddChain(&nftables.Chain{Name: "postrouting", Table: old, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		dual := []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16"), netip.MustParsePrefix("fd42::/56")}
		for range 2 {
			if err := EnsureMasquerade(dual); err != nil {
				t.Fatal(err)
			}
		}
		tables, err := c.ListTables()
		if err != nil {
			t.Fatal(err)
		}
		var kelp []nftables.TableFamily
		for _, tb := range tables {
			if tb.Name == Table {
				kelp = append(kelp, tb.Family)
			}
		}
		if !reflect.DeepEqual(kelp, []nftables.TableFamily{nftables.TableFamilyINet}) {
			t.Fatalf("tables named %s of families %v, want inet only (the IPv4 one of an earlier kelp removed)", Table, kelp)
		}
		table := &nftables.Table{Name: Table, Family: nftables.TableFamilyINet}
		rules, err := c.GetRules(table, &nftables.Chain{Name: "postrouting", Table: table})
		if err != nil {
			t.Fatal(err)
		}
		if len(rules) != 2 {
			t.Fatalf("%d rules, want one per family", len(rules))
		}
		if err := EnsureMasquerade(dual[:1]); err != nil {
			t.Fatal(err)
		}
		if rules, err := c.GetRules(table, &nftables.Chain{Name: "postrouting", Table: table}); err != nil || len(rules) != 1 {
			t.Fatalf("IPv4 only again: %d rules, %v", len(rules), err)
		}
	})
}

func TestKeepRouterAdvertisements(t *testing.T) {
	dir := t.TempDir()
	for name, value := range map[string]string{"all": "1", "default": "1", "lo": "1", "eth0": "1", "eth1": "0", "eth2": "2"} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "accept_ra"), []byte(value+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := keepRouterAdvertisements(dir); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"all": "1\n", "default": "1\n", "lo": "1\n", "eth0": "2", "eth1": "0\n", "eth2": "2\n"} {
		if got, _ := os.ReadFile(filepath.Join(dir, name, "accept_ra")); string(got) != want {
			t.Errorf("%s accept_ra %q, want %q", name, got, want)
		}
	}
}

func TestPodCIDRs(t *testing.T) {
	for _, tt := range []struct {
		spec corev1.NodeSpec
		want []netip.Prefix
	}{
		{corev1.NodeSpec{PodCIDR: "10.42.1.0/24", PodCIDRs: []string{"10.42.1.0/24", "fd42:0:0:1::/64"}},
			[]netip.Prefix{netip.MustParsePrefix("10.42.1.0/24"), netip.MustParsePrefix("fd42:0:0:1::/64")}},
		{corev1.NodeSpec{PodCIDR: "10.42.1.0/24"}, []netip.Prefix{netip.MustParsePrefix("10.42.1.0/24")}},
		{corev1.NodeSpec{}, nil},
	} {
		if got := podCIDRs([]corev1.Node{{Spec: tt.spec}}); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("podCIDRs(%+v) = %v, want %v", tt.spec, got, tt.want)
		}
	}
}
