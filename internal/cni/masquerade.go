package cni

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/nft"
)

// Table is kelp's nftables table for the pod network, of family inet: it
// holds the rules of both IP families.
const Table = "kelp"

// EnsureMasquerade replaces kelp's table with one rule per pod range:
// traffic from pods to anywhere outside their range leaves with the node's
// address. The whole table is swapped in one netlink batch, which also
// removes the IPv4-only table of the same name that kelp made before it
// knew IPv6.
func EnsureMasquerade(clusterCIDRs []netip.Prefix) error {
	if len(clusterCIDRs) == 0 {
		return fmt.Errorf("pod masquerade: no cluster CIDR")
	}
	c, err := nft.New()
	if err != nil {
		return fmt.Errorf("pod masquerade: %w", err)
	}
	// Adding before deleting keeps the deletes from failing on a host
	// that has neither table.
	old := &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4}
	c.AddTable(old)
	c.DelTable(old)
	table := &nftables.Table{Name: Table, Family: nftables.TableFamilyINet}
	c.AddTable(table)
	c.DelTable(table)
	c.AddTable(table)
	chain := c.AddChain(&nftables.Chain{
		Name:     "postrouting",
		Table:    table,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
	})
	for _, cidr := range clusterCIDRs {
		c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: masquerade(cidr)})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("pod masquerade: program nftables table %s: %w (is nf_tables in the kernel? see `kelp check-config`)", Table, err)
	}
	return nil
}

// masquerade is the rule for one pod range: the packet's family, its
// source in the range, its destination outside it.
func masquerade(cidr netip.Prefix) []expr.Any {
	proto, size, src, dst := byte(unix.NFPROTO_IPV4), uint32(4), uint32(12), uint32(16)
	if cidr.Addr().Is6() {
		proto, size, src, dst = unix.NFPROTO_IPV6, 16, 8, 24
	}
	network := cidr.Masked().Addr().AsSlice()
	mask := net.CIDRMask(cidr.Bits(), int(size)*8)
	match := func(offset uint32, op expr.CmpOp) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: mask, Xor: make([]byte, size)},
			&expr.Cmp{Op: op, Register: 1, Data: network},
		}
	}
	out := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
	out = append(out, match(src, expr.CmpOpEq)...)
	out = append(out, match(dst, expr.CmpOpNeq)...)
	return append(out, &expr.Masq{FullyRandom: true})
}

// EnableForwarding turns on what the kernel needs to route pod traffic:
// IPv4 forwarding, IPv6 forwarding where the cluster has IPv6 pods, and
// bridge traffic through netfilter where the kernel has br_netfilter.
func EnableForwarding(ipv6 bool) error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	if ipv6 {
		if err := keepRouterAdvertisements("/proc/sys/net/ipv6/conf"); err != nil {
			return err
		}
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
			return fmt.Errorf("enable IPv6 forwarding (is IPv6 disabled on this machine? net.ipv6.conf.all.disable_ipv6 must be 0 in a dual-stack cluster): %w", err)
		}
	}
	calls := []string{"bridge-nf-call-iptables"}
	if ipv6 {
		calls = append(calls, "bridge-nf-call-ip6tables")
	}
	for _, f := range calls {
		path := "/proc/sys/net/bridge/" + f
		if _, err := os.Stat(path); err == nil {
			if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
				return fmt.Errorf("enable bridge netfilter: %w", err)
			}
		}
	}
	return nil
}

// keepRouterAdvertisements makes every interface under dir (a
// /proc/sys/net/ipv6/conf) that takes router advertisements keep taking
// them once IPv6 forwarding is on, which otherwise turns them off
// (accept_ra 1 → 2): a machine whose IPv6 address and default route come
// from SLAAC would lose them.
func keepRouterAdvertisements(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("enable IPv6 forwarding: %w", err)
	}
	for _, e := range entries {
		if e.Name() == "all" || e.Name() == "default" || e.Name() == "lo" {
			continue
		}
		path := filepath.Join(dir, e.Name(), "accept_ra")
		data, err := os.ReadFile(path)
		if err != nil || strings.TrimSpace(string(data)) != "1" {
			continue
		}
		if err := os.WriteFile(path, []byte("2"), 0o644); err != nil {
			return fmt.Errorf("keep router advertisements on %s with IPv6 forwarding: %w", e.Name(), err)
		}
	}
	return nil
}
