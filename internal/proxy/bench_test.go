package proxy

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kelp-dev/kelp/internal/nft"
)

// The size of the benchmarks: Services of one port, each with a ClusterIP
// and a NodePort, and their ready endpoints.
const benchServices, benchEndpoints = 1000, 10

var benchCIDRs = []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16")}

// BenchmarkPorts1000x10 computes what the proxy programs from the Services and
// EndpointSlices, as every sync does first.
func BenchmarkPorts1000x10(b *testing.B) {
	svcs, eps := benchObjects()
	for b.Loop() {
		Ports(svcs, eps, "node-a", netip.Addr{})
	}
}

// BenchmarkApply1000x10 programs the kernel, each part in a network
// namespace of its own:
//
//	from-scratch               Apply where there is no table yet, as at start
//	one-endpoint-changed       a whole sync of Run after one endpoint of one
//	                           Service moved: Ports, then program (the
//	                           comparison with what was applied and the
//	                           update of the changed Service's chains and
//	                           elements); each part is also reported on its
//	                           own (ms/op of compute and program)
//	one-endpoint-changed-full  the same where the table is replaced whole, as
//	                           after someone else changed it
func BenchmarkApply1000x10(b *testing.B) {
	svcs, eps := benchObjects()
	ports := Ports(svcs, eps, "node-a", netip.Addr{})
	b.Run("from-scratch", func(b *testing.B) {
		c := netnsConn(b)
		for b.Loop() {
			if err := Apply(c, benchCIDRs, ports); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			c.DelTable(ipv4.proxyTable())
			if err := c.Flush(); err != nil {
				b.Fatalf("delete table: %v", err)
			}
			b.StartTimer()
		}
	})
	oneEndpointChanged := func(b *testing.B, whole bool) {
		p := &proxy{conn: netnsConn(b), cfg: Config{ClusterCIDRs: benchCIDRs}}
		if err := p.program(ports); err != nil {
			b.Fatal(err)
		}
		// The endpoint moves back and forth, so every sync is a change.
		moved := &eps[benchServices/2].Endpoints[0].Addresses[0]
		addrs := [2]string{*moved, "10.42.255.1"}
		defer func() { *moved = addrs[0] }()
		var compute, program time.Duration
		for i := 0; b.Loop(); i++ {
			*moved = addrs[(i+1)%2]
			p.inStep = p.inStep && !whole
			started := time.Now()
			now := Ports(svcs, eps, "node-a", netip.Addr{})
			computed := time.Now()
			if err := p.program(now); err != nil {
				b.Fatal(err)
			}
			compute += computed.Sub(started)
			program += time.Since(computed)
		}
		b.StopTimer()
		if n := countChains(p.conn, benchCIDRs); n != p.chains {
			b.Fatalf("the table has %d chains; the proxy counts %d", n, p.chains)
		}
		n := float64(b.N)
		b.ReportMetric(compute.Seconds()*1e3/n, "compute-ms/op")
		b.ReportMetric(program.Seconds()*1e3/n, "program-ms/op")
		b.ReportMetric(float64(p.chains), "chains")
	}
	b.Run("one-endpoint-changed", func(b *testing.B) { oneEndpointChanged(b, false) })
	b.Run("one-endpoint-changed-full", func(b *testing.B) { oneEndpointChanged(b, true) })
}

// netnsConn connects to the nftables of a network namespace of its own,
// which lives until the test or benchmark ends. Unlike inNewNetns, the caller's
// goroutine stays free: on a locked thread every wakeup of the netlink
// receive path (one per ack) costs a thread handoff that kelp does not pay.
// It has the buffers of kelp's own connections (package nft).
func netnsConn(tb testing.TB) *nftables.Conn {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root for a network namespace")
	}
	type netns struct {
		fd  int
		err error
	}
	nsc := make(chan netns, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: Go retires the thread
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			nsc <- netns{err: fmt.Errorf("unshare: %w", err)}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		nsc <- netns{fd, err}
	}()
	ns := <-nsc
	if ns.err != nil {
		tb.Fatal(ns.err)
	}
	tb.Cleanup(func() { unix.Close(ns.fd) })
	c, err := nft.New(nftables.WithNetNSFd(ns.fd))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// benchObjects are the NodePort Services with their EndpointSlices, as the
// informers hand them to a sync.
func benchObjects() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	var svcs []*corev1.Service
	var eps []*discoveryv1.EndpointSlice
	for i := range benchServices {
		name := fmt.Sprintf("svc-%d", i)
		clusterIP := netip.AddrFrom4([4]byte{10, 43, byte(1 + i>>8), byte(i)})
		svcs = append(svcs, service(name, clusterIP.String(), corev1.ServiceTypeNodePort,
			corev1.ServicePort{Name: "http", Port: 80, NodePort: int32(30000 + i), Protocol: corev1.ProtocolTCP}))
		var endpoints []discoveryv1.Endpoint
		for j := range benchEndpoints {
			n := i*benchEndpoints + j
			endpoints = append(endpoints, onNode(netip.AddrFrom4([4]byte{10, 42, byte(n >> 8), byte(n)}).String(), "node-a", true, true, false))
		}
		eps = append(eps, slice(name, "http", 8080, endpoints...))
	}
	return svcs, eps
}
