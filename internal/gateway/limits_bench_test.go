package gateway

import (
	"errors"
	"flag"
	"math"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var idleConns = flag.Int("idle-conns", 5000, "connections BenchmarkIdleConnections opens")

// BenchmarkIdleConnections opens -idle-conns connections to a data path's
// HTTP port that send nothing, and reports how many it keeps open, the
// memory of the process they take (RSS, and the Go heap and stacks) and
// the status of a request from another client address meanwhile (0: no
// answer). uncapped: caps above the connections; capped: the default
// limits, the connections from one address; capped-64-sources: from 64.
// The connections are bare sockets, which cost the process nothing of its
// own. RSS does not shrink: run each case in a process of its own, as
// scripts/bench-gateway-conns.sh does.
func BenchmarkIdleConnections(b *testing.B) {
	for _, bc := range []struct {
		name    string
		limits  Limits
		sources int
	}{
		{"uncapped", Limits{MaxConns: math.MaxInt, MaxConnsPerSource: math.MaxInt}, 1},
		{"capped", Limits{}, 1},
		{"capped-64-sources", Limits{}, 64},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				idleConnections(b, bc.limits, bc.sources)
			}
		})
	}
}

func idleConnections(b *testing.B, limits Limits, sources int) {
	addr := limited(b, limits, "127.0.0.1:1")
	status := func() int {
		resp, err := (&http.Client{
			Timeout: 5 * time.Second,
			Transport: &http.Transport{
				DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 250)}}).DialContext,
				DisableKeepAlives: true,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}).Get("http://" + addr + "/")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if status() == 0 {
		b.Fatal("the data path does not answer")
	}
	rss0, heap0 := memory(b)

	port, _ := strconv.Atoi(addr[strings.LastIndex(addr, ":")+1:])
	fds := make([]int, 0, *idleConns)
	defer func() {
		for _, fd := range fds {
			_ = syscall.Close(fd)
		}
	}()
	for i := range *idleConns {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			b.Fatalf("socket %d: %v (raise the limit of open files, ulimit -n)", i, err)
		}
		fds = append(fds, fd)
		if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, byte(1 + i%sources)}}); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Connect(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			b.Fatalf("connection %d: %v", i, err)
		}
	}
	// Refused connections are closed at once: settled when no more
	// closes come for a second.
	kept := len(fds)
	for stable := 0; stable < 5; time.Sleep(200 * time.Millisecond) {
		n := open(fds)
		if n == kept {
			stable++
		} else {
			kept, stable = n, 0
		}
	}
	rss1, heap1 := memory(b)
	b.ReportMetric(float64(kept), "kept")
	b.ReportMetric(float64(rss1-rss0)/(1<<20), "RSS-MiB")
	b.ReportMetric(float64(heap1-heap0)/(1<<20), "heap+stacks-MiB")
	b.ReportMetric(float64(status()), "status")
}

// open is how many of the sockets the other end has not closed.
func open(fds []int) int {
	n := 0
	buf := make([]byte, 1)
	for _, fd := range fds {
		_, _, err := syscall.Recvfrom(fd, buf, syscall.MSG_DONTWAIT|syscall.MSG_PEEK)
		if errors.Is(err, syscall.EAGAIN) {
			n++
		}
	}
	return n
}

// memory is the process's resident memory and the Go heap and stacks in
// use, in bytes, once what is free went back to the system.
func memory(b *testing.B) (rss, heap int64) {
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kib, _ := strconv.ParseInt(f[1], 10, 64)
			rss = kib << 10
		}
	}
	return rss, int64(m.HeapInuse + m.StackInuse)
}
