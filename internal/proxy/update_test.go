package proxy

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/testcluster"
)

var testCIDRs = []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16"), netip.MustParsePrefix("fd42::/56")}

func addrPorts(s ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range s {
		out = append(out, netip.MustParseAddrPort(a))
	}
	return out
}

// updatePorts has a port of every kind, of both families, and Services
// that the changes of TestUpdate leave alone.
func updatePorts() []Port {
	ip := netip.MustParseAddr
	ports := []Port{
		{ClusterIP: ip("10.43.0.1"), Protocol: unix.IPPROTO_TCP, Port: 443, Endpoints: addrPorts("10.99.0.2:6443")},
		{ClusterIP: ip("10.43.0.20"), Protocol: unix.IPPROTO_UDP, Port: 53, NodePort: 30053,
			ExternalIPs: []netip.Addr{ip("192.0.2.7")}, Endpoints: addrPorts("10.42.0.5:5353", "10.42.0.6:5353")},
		{ClusterIP: ip("10.43.0.30"), Protocol: unix.IPPROTO_TCP, Port: 80},
		{ClusterIP: ip("10.43.0.40"), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: 30040,
			Endpoints: addrPorts("10.42.0.5:80", "10.42.1.5:80"), ExternalLocal: true, LocalEndpoints: addrPorts("10.42.0.5:80"),
			Affinity: time.Minute},
		// The external address and port of 10.43.0.20, which has it first.
		{ClusterIP: ip("10.43.0.60"), Protocol: unix.IPPROTO_UDP, Port: 53,
			ExternalIPs: []netip.Addr{ip("192.0.2.7")}, Endpoints: addrPorts("10.42.0.9:53")},
	}
	for i := range 6 {
		p := Port{ClusterIP: netip.AddrFrom4([4]byte{10, 43, 1, byte(i)}), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: uint16(31000 + i)}
		for j := range 3 {
			p.Endpoints = append(p.Endpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 42, 2, byte(i*3 + j)}), 8080))
		}
		ports = append(ports, p)
	}
	return append(ports,
		// The IPv6 side of a dual-stack Service, on the same NodePort.
		Port{ClusterIP: ip("fd43::20"), Protocol: unix.IPPROTO_UDP, Port: 53, NodePort: 30053,
			ExternalIPs: []netip.Addr{ip("2001:db8::7")}, Endpoints: addrPorts("[fd42::5]:5353", "[fd42::6]:5353")},
		Port{ClusterIP: ip("fd43::40"), Protocol: unix.IPPROTO_TCP, Port: 80, NodePort: 30040,
			Endpoints: addrPorts("[fd42::5]:80", "[fd42:0:0:1::5]:80"), ExternalLocal: true, LocalEndpoints: addrPorts("[fd42::5]:80"),
			Affinity: time.Minute},
		Port{ClusterIP: ip("fd43::30"), Protocol: unix.IPPROTO_TCP, Port: 80},
		Port{Protocol: unix.IPPROTO_TCP, NodePort: 8443, Endpoints: addrPorts("10.42.0.7:443")},
		Port{Protocol: unix.IPPROTO_TCP, NodePort: 8443, Endpoints: addrPorts("[fd42::7]:443")},
		// The NodePort of 10.43.0.20, which has it first.
		Port{Protocol: unix.IPPROTO_UDP, NodePort: 30053, Endpoints: addrPorts("10.42.0.8:53")},
		Port{Protocol: unix.IPPROTO_TCP, Port: 8080, ExternalIPs: []netip.Addr{ip("192.0.2.1")}, Endpoints: addrPorts("10.42.0.9:8080")},
	)
}

// clonePorts copies ports deeply enough for a change to leave them alone.
func clonePorts(ports []Port) []Port {
	out := slices.Clone(ports)
	for i := range out {
		out[i].ExternalIPs = slices.Clone(out[i].ExternalIPs)
		out[i].Endpoints = slices.Clone(out[i].Endpoints)
		out[i].LocalEndpoints = slices.Clone(out[i].LocalEndpoints)
	}
	return out
}

// edit changes the port of the Service at clusterIP.
func edit(ports []Port, clusterIP string, change func(*Port)) []Port {
	i := slices.IndexFunc(ports, func(p Port) bool { return p.ClusterIP == netip.MustParseAddr(clusterIP) })
	change(&ports[i])
	return ports
}

func without(ports []Port, name string) []Port {
	return slices.DeleteFunc(ports, func(p Port) bool { return portName(p) == name })
}

// TestUpdate changes the table step by step as syncs do, and after each
// step checks that the kernel holds what Apply makes of the same ports,
// that the ports that did not change kept their rules (the same handles:
// they were not touched), and that the proxy's count of chains,
// which the tamper check compares, is right.
func TestUpdate(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		c, err := nft.New()
		if err != nil {
			t.Fatal(err)
		}
		p := &proxy{conn: c, cfg: Config{ClusterCIDRs: testCIDRs}}
		// A Service more, which comes first and goes first: after that no
		// rule keeps the handle it would have in a table made anew.
		first := Port{ClusterIP: netip.MustParseAddr("10.43.0.0"), Protocol: unix.IPPROTO_TCP, Port: 80, Endpoints: addrPorts("10.42.5.1:80")}
		ports := append([]Port{first}, updatePorts()...)
		if err := p.program(ports); err != nil {
			t.Fatal(err)
		}
		steps := []struct {
			name   string
			change func([]Port) []Port
		}{
			{"the first Service goes", func(ps []Port) []Port {
				return without(ps, "svc-10.43.0.0-6-80")
			}},
			{"an endpoint of a Service moves", func(ps []Port) []Port {
				return edit(ps, "10.43.1.2", func(p *Port) { p.Endpoints[0] = netip.MustParseAddrPort("10.42.9.9:8080") })
			}},
			{"a Service goes; a hostPort takes its NodePort, a Service its external address", func(ps []Port) []Port {
				return without(ps, "svc-10.43.0.20-17-53")
			}},
			{"a Service comes", func(ps []Port) []Port {
				return append(ps, Port{ClusterIP: netip.MustParseAddr("10.43.0.50"), Protocol: unix.IPPROTO_TCP, Port: 8443, NodePort: 30050,
					ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.8")}, Endpoints: addrPorts("10.42.3.1:8443", "10.42.3.2:8443")})
			}},
			{"a Service loses its last endpoint", func(ps []Port) []Port {
				return edit(ps, "10.43.0.1", func(p *Port) { p.Endpoints = nil })
			}},
			{"a Service without endpoints gets one", func(ps []Port) []Port {
				return edit(ps, "10.43.0.30", func(p *Port) { p.Endpoints = addrPorts("10.42.3.3:80") })
			}},
			{"externalTrafficPolicy Cluster again", func(ps []Port) []Port {
				return edit(ps, "10.43.0.40", func(p *Port) { p.ExternalLocal, p.LocalEndpoints = false, nil })
			}},
			{"the affinity timeout changes", func(ps []Port) []Port {
				return edit(ps, "10.43.0.40", func(p *Port) { p.Affinity = 2 * time.Minute })
			}},
			{"a NodePort moves", func(ps []Port) []Port {
				return edit(ps, "10.43.1.3", func(p *Port) { p.NodePort = 31100 })
			}},
			{"externalTrafficPolicy Local without local endpoints", func(ps []Port) []Port {
				return edit(ps, "10.43.0.50", func(p *Port) { p.ExternalLocal = true })
			}},
			{"a hostPort goes, another comes", func(ps []Port) []Port {
				ps = without(ps, "hostport-6-8443-0-10.42.0.7:443")
				return append(ps, Port{Protocol: unix.IPPROTO_TCP, NodePort: 8443, Endpoints: addrPorts("10.42.0.10:443")})
			}},
			{"an endpoint of an IPv6 Service moves", func(ps []Port) []Port {
				return edit(ps, "fd43::20", func(p *Port) { p.Endpoints[1] = netip.MustParseAddrPort("[fd42::9]:5353") })
			}},
			{"an IPv6 Service without endpoints gets one", func(ps []Port) []Port {
				return edit(ps, "fd43::30", func(p *Port) { p.Endpoints = addrPorts("[fd42::3]:80") })
			}},
			{"the IPv6 side of a dual-stack Service goes", func(ps []Port) []Port {
				return without(ps, "svc-fd43::40-6-80")
			}},
			{"an IPv6 Service comes", func(ps []Port) []Port {
				return append(ps, Port{ClusterIP: netip.MustParseAddr("fd43::50"), Protocol: unix.IPPROTO_TCP, Port: 8443, NodePort: 30050,
					Endpoints: addrPorts("[fd42::3:1]:8443"), Affinity: time.Hour})
			}},
			{"many changes at once", func(ps []Port) []Port {
				ps = without(ps, "svc-10.43.1.0-6-80")
				ps = edit(ps, "10.43.1.1", func(p *Port) { p.Endpoints = addrPorts("10.42.4.1:8080", "10.42.4.2:8080") })
				ps = edit(ps, "10.43.0.40", func(p *Port) { p.Affinity = 0 })
				return append(ps, Port{ClusterIP: netip.MustParseAddr("10.43.1.9"), Protocol: unix.IPPROTO_SCTP, Port: 80, Endpoints: addrPorts("10.42.4.3:80")})
			}},
		}
		for _, step := range steps {
			next := step.change(clonePorts(ports))
			before := handles(t, c)
			if err := p.program(next); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
			after := handles(t, c)
			untouched := 0
			for _, f := range families {
				cidr, _ := cidrOf(testCIDRs, f)
				old, now := newPlan(ports, f), newPlan(next, f)
				for _, name := range now.names {
					if !reflect.DeepEqual(old.ports[name], now.ports[name]) {
						continue
					}
					for _, o := range portObjects(f.proxyTable(), f, name, cidr, now.ports[name]) {
						if o.chain == nil {
							continue
						}
						untouched++
						chain := tableName(f) + " " + o.chain.Name
						if before[chain] != after[chain] {
							t.Errorf("%s: chain %s of a port that did not change was rebuilt: handles %s, then %s", step.name, chain, before[chain], after[chain])
						}
					}
				}
			}
			if untouched == 0 {
				t.Fatalf("%s: no port left alone", step.name)
			}
			if got, want := dump(t, c), fullDump(t, next); got != want {
				t.Errorf("%s: the table differs from what Apply makes:\n%s", step.name, lineDiff(got, want))
			}
			if n := countChains(c, testCIDRs); n != p.chains {
				t.Errorf("%s: the table has %d chains; the proxy counts %d", step.name, n, p.chains)
			}
			ports = next
		}
	})
}

// TestUpdateKeepsAffinity checks that clients keep sticking to the
// endpoints that stay, through a change of their Service's endpoints and
// of its timeout.
func TestUpdateKeepsAffinity(t *testing.T) {
	testcluster.InNewNetns(t, func() {
		c, err := nft.New()
		if err != nil {
			t.Fatal(err)
		}
		p := &proxy{conn: c, cfg: Config{ClusterCIDRs: testCIDRs}}
		svc := Port{ClusterIP: netip.MustParseAddr("10.43.0.40"), Protocol: unix.IPPROTO_TCP, Port: 80,
			Endpoints: addrPorts("10.42.0.5:80", "10.42.0.6:80"), Affinity: time.Minute}
		other := Port{ClusterIP: netip.MustParseAddr("10.43.0.41"), Protocol: unix.IPPROTO_TCP, Port: 80, Endpoints: addrPorts("10.42.0.7:80")}
		if err := p.program([]Port{svc, other}); err != nil {
			t.Fatal(err)
		}
		set := func(ep string, timeout time.Duration) *nftables.Set {
			return &nftables.Set{Table: ipv4.proxyTable(), Name: affinitySetName(svc, netip.MustParseAddrPort(ep)), KeyType: nftables.TypeIPAddr, HasTimeout: true, Timeout: timeout}
		}
		client := []nftables.SetElement{{Key: []byte{10, 42, 3, 3}, Timeout: 30 * time.Second}}
		for _, ep := range []string{"10.42.0.5:80", "10.42.0.6:80"} {
			if err := c.SetAddElements(set(ep, time.Minute), client); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Flush(); err != nil {
			t.Fatalf("add affinity entries: %v", err)
		}
		sticks := func(when, ep string) {
			t.Helper()
			elems, err := c.GetSetElements(set(ep, 0))
			if err != nil || len(elems) != 1 || elems[0].Expires <= 0 || elems[0].Expires > 30*time.Second {
				t.Errorf("%s: clients of %s: %+v %v, want the one with its time left", when, ep, elems, err)
			}
		}
		otherChains := handles(t, c)["ip svc-10.43.0.41-6-80"]

		// 10.42.0.6 goes, 10.42.0.8 and 10.42.0.9 come (in a table made
		// anew, the rules of the other Service would move).
		svc.Endpoints = addrPorts("10.42.0.5:80", "10.42.0.8:80", "10.42.0.9:80")
		if err := p.program([]Port{svc, other}); err != nil {
			t.Fatal(err)
		}
		sticks("endpoints changed", "10.42.0.5:80")
		if _, err := c.GetSetByName(ipv4.proxyTable(), set("10.42.0.6:80", 0).Name); err == nil {
			t.Error("endpoints changed: the clients of the endpoint that went are still there")
		}

		svc.Affinity = 2 * time.Minute
		if err := p.program([]Port{svc, other}); err != nil {
			t.Fatal(err)
		}
		sticks("timeout changed", "10.42.0.5:80")
		if s, err := c.GetSetByName(ipv4.proxyTable(), set("10.42.0.5:80", 0).Name); err != nil || s.Timeout != 2*time.Minute {
			t.Errorf("timeout changed: set %+v, %v; want a timeout of 2m", s, err)
		}
		if got := handles(t, c)["ip svc-10.43.0.41-6-80"]; got != otherChains {
			t.Errorf("the other Service's chain was rebuilt (handles %s, then %s): the table was replaced, not updated", otherChains, got)
		}
		if got, want := dump(t, c), fullDump(t, []Port{svc, other}); got != want {
			t.Errorf("the table differs from what Apply makes:\n%s", lineDiff(got, want))
		}
	})
}

// TestProgramReplacesAChangedTable checks that where the table is not as
// the proxy left it, so that an update fails, the next sync replaces it.
func TestProgramReplacesAChangedTable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(*nftables.Conn)
		// gone is the port the next sync removes, from the table
		// tampered with. (A table the update does not touch is left to the
		// tamper check: see TestRun.)
		gone string
	}{
		{"table deleted", func(c *nftables.Conn) { c.DelTable(ipv4.proxyTable()) }, "svc-10.43.1.2-6-80"},
		{"IPv6 table deleted", func(c *nftables.Conn) { c.DelTable(ipv6.proxyTable()) }, "svc-fd43::30-6-80"},
		{"map flushed", func(c *nftables.Conn) {
			serviceIPs, _, _ := sharedSets(ipv4.proxyTable(), ipv4)
			c.FlushSet(serviceIPs)
		}, "svc-10.43.1.2-6-80"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testcluster.InNewNetns(t, func() {
				c, err := nft.New()
				if err != nil {
					t.Fatal(err)
				}
				p := &proxy{conn: c, cfg: Config{ClusterCIDRs: testCIDRs}}
				ports := updatePorts()
				if err := p.program(ports); err != nil {
					t.Fatal(err)
				}
				tc.tamper(c)
				if err := c.Flush(); err != nil {
					t.Fatal(err)
				}
				// The update deletes the element of the Service that goes.
				next := without(clonePorts(ports), tc.gone)
				if err := p.program(next); err != nil {
					t.Fatal(err)
				}
				if got, want := dump(t, c), fullDump(t, next); got != want {
					t.Errorf("the table differs from what Apply makes:\n%s", lineDiff(got, want))
				}
				if n := countChains(c, testCIDRs); n != p.chains {
					t.Errorf("the table has %d chains; the proxy counts %d", n, p.chains)
				}
			})
		})
	}
}

// handles names each chain of the tables, by its table's family and its
// name, with the handles of its rules: a rule that is deleted and added
// again gets a new one. (Chains have handles too, but google/nftables does
// not read them.)
func handles(t *testing.T, c *nftables.Conn) map[string]string {
	t.Helper()
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, ch := range chains {
		if ch.Table.Name != Table {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		var h []string
		for _, r := range rules {
			h = append(h, fmt.Sprint(r.Handle))
		}
		out[tableName(familyOfTable(ch.Table))+" "+ch.Name] = strings.Join(h, " ")
	}
	return out
}

// tableName is how nft names the family of a table.
func tableName(f *family) string {
	if f == ipv6 {
		return "ip6"
	}
	return "ip"
}

func familyOfTable(t *nftables.Table) *family {
	for _, f := range families {
		if f.table == t.Family {
			return f
		}
	}
	return nil
}

// fullDump is the dump of the tables Apply makes of ports, in a network
// namespace of its own.
func fullDump(t *testing.T, ports []Port) string {
	t.Helper()
	c := netnsConn(t)
	if err := Apply(c, testCIDRs, ports); err != nil {
		t.Fatal(err)
	}
	return dump(t, c)
}

// dump lists the proxy's tables as the kernel holds them, in order of
// names and without handles, one line per chain, rule, set and element,
// each led by its table's family; and the tables of kelp-proxy's name of
// another family.
func dump(t *testing.T, c *nftables.Conn) string {
	t.Helper()
	var lines []string
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range tables {
		if table.Name != Table {
			continue
		}
		f := familyOfTable(table)
		if f == nil {
			lines = append(lines, fmt.Sprintf("table of family %d", table.Family))
			continue
		}
		lines = append(lines, dumpTable(t, c, f)...)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func dumpTable(t *testing.T, c *nftables.Conn, f *family) []string {
	t.Helper()
	table := f.proxyTable()
	chains, err := c.ListChainsOfTableFamily(f.table)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	add := func(format string, args ...any) {
		lines = append(lines, tableName(f)+" "+fmt.Sprintf(format, args...))
	}
	for _, ch := range chains {
		if ch.Table.Name != Table {
			continue
		}
		head := "chain " + ch.Name
		if ch.Hooknum != nil {
			head += fmt.Sprintf(" type %s hook %d priority %d", ch.Type, *ch.Hooknum, *ch.Priority)
		}
		rules, err := c.GetRules(table, ch)
		if err != nil {
			t.Fatal(err)
		}
		add("%s", head)
		for i, r := range rules {
			line := fmt.Sprintf("chain %s rule %d:", ch.Name, i)
			for _, e := range r.Exprs {
				line += fmt.Sprintf(" %T%+v", e, e)
			}
			add("%s", line)
		}
	}
	sets, err := c.GetSets(table)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		add("set %s map=%v constant=%v timeout=%v/%v dynamic=%v concat=%v key=%s data=%s",
			s.Name, s.IsMap, s.Constant, s.HasTimeout, s.Timeout, s.Dynamic, s.Concatenation, s.KeyType.Name, s.DataType.Name)
		if s.Dynamic {
			continue // clients in affinity sets: what traffic did, not the proxy
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range elems {
			line := fmt.Sprintf("set %s element %x", s.Name, e.Key)
			if v := e.VerdictData; v != nil {
				line += fmt.Sprintf(" verdict %d %s", v.Kind, v.Chain)
			}
			add("%s", line)
		}
	}
	return lines
}

// lineDiff lists the lines only one of two dumps has.
func lineDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	var out []string
	for _, l := range g {
		if !slices.Contains(w, l) {
			out = append(out, "+ "+l)
		}
	}
	for _, l := range w {
		if !slices.Contains(g, l) {
			out = append(out, "- "+l)
		}
	}
	return strings.Join(out, "\n")
}
