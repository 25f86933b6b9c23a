package proxy

import (
	"fmt"
	"net/netip"
	"os"
	"reflect"
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

var benchCIDR = netip.MustParsePrefix("10.42.0.0/16")

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
//	from-scratch          Apply where there is no table yet, as at start
//	one-endpoint-changed  a whole sync of Run after one endpoint of one
//	                      Service moved: Ports, the comparison with what was
//	                      applied, Apply (which replaces the whole table)
//	                      and the count of its chains; each part is also
//	                      reported on its own (ms/op of compute, apply, count)
func BenchmarkApply1000x10(b *testing.B) {
	svcs, eps := benchObjects()
	ports := Ports(svcs, eps, "node-a", netip.Addr{})
	b.Run("from-scratch", func(b *testing.B) {
		c := benchConn(b)
		for b.Loop() {
			if err := Apply(c, benchCIDR, ports); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			c.DelTable(&nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4})
			if err := c.Flush(); err != nil {
				b.Fatalf("delete table: %v", err)
			}
			b.StartTimer()
		}
	})
	b.Run("one-endpoint-changed", func(b *testing.B) {
		c := benchConn(b)
		if err := Apply(c, benchCIDR, ports); err != nil {
			b.Fatal(err)
		}
		applied := ports
		// The endpoint moves back and forth, so every sync is a change.
		moved := &eps[benchServices/2].Endpoints[0].Addresses[0]
		addrs := [2]string{*moved, "10.42.255.1"}
		defer func() { *moved = addrs[0] }()
		var compute, apply, count time.Duration
		var chains int
		for i := 0; b.Loop(); i++ {
			*moved = addrs[(i+1)%2]
			started := time.Now()
			now := Ports(svcs, eps, "node-a", netip.Addr{})
			if reflect.DeepEqual(now, applied) {
				b.Fatalf("sync %d: no change", i)
			}
			staleUDPFlows(applied, now)
			computed := time.Now()
			if err := Apply(c, benchCIDR, now); err != nil {
				b.Fatal(err)
			}
			applied = now
			done := time.Now()
			chains = countChains(c)
			compute += computed.Sub(started)
			apply += done.Sub(computed)
			count += time.Since(done)
		}
		n := float64(b.N)
		b.ReportMetric(compute.Seconds()*1e3/n, "compute-ms/op")
		b.ReportMetric(apply.Seconds()*1e3/n, "apply-ms/op")
		b.ReportMetric(count.Seconds()*1e3/n, "count-ms/op")
		b.ReportMetric(float64(chains), "chains")
	})
}

// benchConn connects to the nftables of a network namespace of its own,
// which lives until the benchmark ends. Unlike inNewNetns, the caller's
// goroutine stays free: on a locked thread every wakeup of the netlink
// receive path (one per ack) costs a thread handoff that kelp does not pay.
// It has the buffers of kelp's own connections (package nft).
func benchConn(b *testing.B) *nftables.Conn {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("needs root for a network namespace")
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
		b.Fatal(ns.err)
	}
	b.Cleanup(func() { unix.Close(ns.fd) })
	c, err := nft.New(nftables.WithNetNSFd(ns.fd))
	if err != nil {
		b.Fatal(err)
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
