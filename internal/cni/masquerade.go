package cni

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/kelp-dev/kelp/internal/nft"
)

// Table is kelp's nftables table for the pod network.
const Table = "kelp"

// EnsureMasquerade replaces kelp's table with one rule: traffic from pods
// to anywhere outside the cluster network leaves with the node's address.
// The whole table is swapped in one netlink batch.
func EnsureMasquerade(clusterCIDR netip.Prefix) error {
	if !clusterCIDR.Addr().Is4() {
		return fmt.Errorf("pod masquerade: %s: only IPv4 cluster networks are supported so far", clusterCIDR)
	}
	c, err := nft.New()
	if err != nil {
		return fmt.Errorf("pod masquerade: %w", err)
	}
	table := &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4}
	c.AddTable(table) // so that the delete below cannot fail on a fresh host
	c.DelTable(table)
	c.AddTable(table)
	chain := c.AddChain(&nftables.Chain{
		Name:     "postrouting",
		Table:    table,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
	})
	network := clusterCIDR.Masked().Addr().AsSlice()
	mask := net.CIDRMask(clusterCIDR.Bits(), 32)
	c.AddRule(&nftables.Rule{
		Table: table,
		Chain: chain,
		Exprs: []expr.Any{
			// ip saddr in the cluster network
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: network},
			// ip daddr outside it
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: network},
			&expr.Masq{FullyRandom: true},
		},
	})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("pod masquerade: program nftables table %s: %w (is nf_tables in the kernel? see `kelp check-config`)", Table, err)
	}
	return nil
}

// EnableForwarding turns on what the kernel needs to route pod traffic:
// IPv4 forwarding, and bridge traffic through netfilter where the kernel
// has br_netfilter.
func EnableForwarding() error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	const bridgeNF = "/proc/sys/net/bridge/bridge-nf-call-iptables"
	if _, err := os.Stat(bridgeNF); err == nil {
		if err := os.WriteFile(bridgeNF, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("enable bridge netfilter: %w", err)
		}
	}
	return nil
}
