package config

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/kubeargs"
)

// Node pod ranges the controller-manager hands out by default
// (--node-cidr-mask-size-ipv4 and -ipv6), and the most ranges it hands out
// of an IPv6 cluster CIDR: 2^16, a bitmap it keeps uncompressed.
const (
	nodeMaskIPv4    = 24
	nodeMaskIPv6    = 64
	maxNodeMaskDiff = 16
)

// maxServiceBits bounds an IPv6 Service CIDR to 2^20 addresses, a /108:
// the limit kube-apiserver kept on --service-cluster-ip-range until its
// IP allocator of v1.33 (which no longer checks it); users' docs and
// tools written for it expect it. IPv4 ranges are not held to it, so
// that no cluster that started before is refused.
const maxServiceBits = 20

// ParseCIDRs parses flag's value: one CIDR, or two of different families
// separated by a comma, the first of the primary family.
func ParseCIDRs(flag, raw string) ([]netip.Prefix, error) {
	items := strings.Split(raw, ",")
	if len(items) > 2 {
		return nil, fmt.Errorf("%s %q: want one CIDR, or two (one IPv4, one IPv6) separated by a comma", flag, raw)
	}
	var out []netip.Prefix
	for _, item := range items {
		p, err := parseCIDR(flag, strings.TrimSpace(item))
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if len(out) == 2 && out[0].Addr().Is4() == out[1].Addr().Is4() {
		return nil, fmt.Errorf("%s %q: two CIDRs of one family; a dual-stack cluster takes one IPv4 and one IPv6 CIDR", flag, raw)
	}
	return out, nil
}

// DualStack says whether prefixes hold both families.
func DualStack(prefixes []netip.Prefix) bool {
	return len(prefixes) == 2
}

// ofFamily returns the prefix of prefixes in the family of ip.
func ofFamily(prefixes []netip.Prefix, v6 bool) (netip.Prefix, bool) {
	for _, p := range prefixes {
		if p.Addr().Is6() == v6 {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// FamilyName names an address family: IPv6 if v6, else IPv4.
func FamilyName(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// checkNetworks checks the cluster's pod and Service ranges against each
// other and against what the apiserver and the controller-manager take.
// cmArgs are --kube-controller-manager-arg values, which may change the
// size of the nodes' pod ranges.
func checkNetworks(cluster, service []netip.Prefix, cmArgs []string) error {
	var errs []error
	for _, c := range cluster {
		for _, s := range service {
			if c.Overlaps(s) {
				errs = append(errs, fmt.Errorf("--cluster-cidr %s overlaps --service-cidr %s: pick ranges that do not overlap", c, s))
			}
		}
	}
	if len(cluster) > 0 && len(service) > 0 && (len(cluster) != len(service) || cluster[0].Addr().Is6() != service[0].Addr().Is6()) {
		errs = append(errs, fmt.Errorf("--cluster-cidr %s and --service-cidr %s: give both the same families, the primary first", kubeargs.CIDRs(cluster), kubeargs.CIDRs(service)))
	}
	for _, s := range service {
		if s.Addr().Is6() && 128-s.Bits() > maxServiceBits {
			errs = append(errs, fmt.Errorf("--service-cidr %s is too large: an IPv6 Service range holds at most 2^%d addresses, as kube-apiserver has long required: use a /%d or smaller range, such as %s",
				s, maxServiceBits, 128-maxServiceBits, netip.PrefixFrom(s.Addr(), 128-maxServiceBits)))
		}
	}
	if DualStack(cluster) && slices.ContainsFunc(cmArgs, func(a string) bool { return strings.HasPrefix(strings.TrimLeft(a, "-"), "node-cidr-mask-size=") }) {
		errs = append(errs, errors.New("--kube-controller-manager-arg node-cidr-mask-size is refused by the controller-manager in a dual-stack cluster: set node-cidr-mask-size-ipv4 and node-cidr-mask-size-ipv6 instead"))
	}
	for _, c := range cluster {
		v6 := c.Addr().Is6()
		flag, mask := "node-cidr-mask-size-ipv4", nodeMaskIPv4
		if v6 {
			flag, mask = "node-cidr-mask-size-ipv6", nodeMaskIPv6
		}
		mask, err := nodeMask(cmArgs, flag, mask)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		switch {
		case c.Bits() > mask:
			errs = append(errs, fmt.Errorf("--cluster-cidr %s is smaller than one node's pod range (a /%d, the controller-manager's %s): use a /%d or larger range, or set --kube-controller-manager-arg %s=N with N of %d or more",
				c, mask, flag, mask, flag, c.Bits()))
		case v6 && mask-c.Bits() > maxNodeMaskDiff:
			errs = append(errs, fmt.Errorf("--cluster-cidr %s is too large: the controller-manager hands out at most 2^%d node ranges (a /%d each): use a /%d or smaller range (a /%d gives %d nodes)",
				c, maxNodeMaskDiff, mask, mask-maxNodeMaskDiff, mask-8, 1<<8))
		}
	}
	return errors.Join(errs...)
}

// nodeMask is the node pod range size flag sets in the controller-manager
// arguments, def if none does; the last one wins, as it does there.
func nodeMask(cmArgs []string, flag string, def int) (int, error) {
	mask := def
	for _, a := range cmArgs {
		name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != flag && name != "node-cidr-mask-size" {
			continue
		}
		n, err := strconv.Atoi(value)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("--kube-controller-manager-arg %s: want a prefix length", a)
		}
		mask = n
	}
	return mask, nil
}

// checkNodeIPs allows at most one node IP of each family.
func checkNodeIPs(ips []netip.Addr) error {
	if len(ips) > 2 || (len(ips) == 2 && ips[0].Is4() == ips[1].Is4()) {
		s := make([]string, len(ips))
		for i, ip := range ips {
			s[i] = ip.String()
		}
		return fmt.Errorf("--node-ip %s: give at most one address of each family (one IPv4, one IPv6)", strings.Join(s, ","))
	}
	return nil
}

// CheckNode checks that the node can run in a cluster of these pod and
// Service ranges: a node IP of each family the cluster has, and no IPv6
// range of the cluster on the node's own networks. host is the machine the
// node runs on.
func CheckNode(node Node, host Host, cluster, service []netip.Prefix) error {
	var errs []error
	for _, v6 := range []bool{false, true} {
		c, ok := ofFamily(cluster, v6)
		if !ok || slices.ContainsFunc(node.NodeIPs, func(ip netip.Addr) bool { return ip.Is6() == v6 }) {
			continue
		}
		errs = append(errs, missingNodeIP(node, host, c, v6))
	}
	for _, ip := range node.NodeIPs {
		for _, n := range host.Networks {
			if !n.Contains(ip) {
				continue
			}
			n := n.Masked()
			for _, r := range slices.Concat(cluster, service) {
				if !r.Overlaps(n) {
					continue
				}
				if ip.Is6() {
					errs = append(errs, fmt.Errorf("the cluster's range %s overlaps this node's network %s (node IP %s): pods and Services would shadow the machines of that network; start the cluster with IPv6 ranges outside the nodes' networks (for example fd42::/56 and fd43::/112)", r, n, ip))
				} else {
					logrus.WithField("component", "config").Warnf("the cluster's range %s overlaps this node's network %s (node IP %s): machines of that network whose addresses the cluster uses become unreachable from pods", r, n, ip)
				}
			}
		}
	}
	return errors.Join(errs...)
}

func missingNodeIP(node Node, host Host, c netip.Prefix, v6 bool) error {
	have := make([]string, len(node.NodeIPs))
	for i, ip := range node.NodeIPs {
		have[i] = ip.String()
	}
	what := fmt.Sprintf("the cluster has the %s pod range %s but this node has no %s node IP (it has %s)", FamilyName(v6), c, FamilyName(v6), strings.Join(have, ","))
	if !v6 {
		return fmt.Errorf("%s: start it with --node-ip giving an IPv4 address of the node too", what)
	}
	if host.IPv6Disabled {
		return fmt.Errorf("%s, and IPv6 is disabled on this machine (net.ipv6.conf.all.disable_ipv6=1): enable it (sysctl -w net.ipv6.conf.all.disable_ipv6=0, and in /etc/sysctl.d to keep it), give the machine a global IPv6 address, and start the node with --node-ip V4,V6", what)
	}
	var global []string
	for _, n := range host.Networks {
		if n.Addr().Is6() && n.Addr().IsGlobalUnicast() {
			global = append(global, n.Addr().String())
		}
	}
	if len(global) == 0 {
		return fmt.Errorf("%s, and this machine has no global IPv6 address: give it one (static, SLAAC or DHCPv6) and start the node with --node-ip V4,V6", what)
	}
	return fmt.Errorf("%s: start it with --node-ip giving an IPv6 address of the node too, such as --node-ip %s,%s", what, strings.Join(have, ","), global[0])
}
