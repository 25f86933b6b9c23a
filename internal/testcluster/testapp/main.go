// Command testapp is the one program in the cluster tests' container image.
//
//	testapp serve [-listen :8080]  HTTP: / answers "<hostname> <client addr>", /healthz, /file?path=
//	testapp get URL [TIMEOUT]       print the body of an HTTP GET (exit 1 on failure; default timeout 5s)
//	testapp cat FILE                print a file
//	testapp write FILE TEXT         write TEXT to FILE
//	testapp exit CODE               exit with CODE (for Jobs)
//	testapp udpserve [-listen :5353] UDP: answer every datagram with the hostname
//	testapp udpget ADDR             send a datagram from UDP port 40000, print the answer
//	testapp lookup NAME             print the addresses NAME resolves to
//	testapp srv SERVICE PROTO NAME  print the SRV records as "target port"
//	testapp ptr IP                  print the names of IP
//	testapp cname NAME              print the canonical name of NAME
//	testapp firstanswer [-host H] [-ok] URL  poll URL (as host H) until it answers (200 OK with -ok), print the time of the answer
//	testapp sink [-listen :9000]    TCP: read and discard whatever arrives
//	testapp blast ADDR SECONDS      write to a TCP sink as fast as possible, print MB/s
//	testapp dnsbench NAME N         resolve NAME N times, print the median and 99th percentile
//	testapp httpbench [-host H] [-c 16] URL SECONDS  GET URL (as host H) on c connections for SECONDS, print requests/s and latencies
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		serve(":8080")
		return
	}
	switch os.Args[1] {
	case "serve":
		fs := flag.NewFlagSet("serve", flag.ExitOnError)
		listen := fs.String("listen", ":8080", "address to listen on")
		_ = fs.Parse(os.Args[2:])
		serve(*listen)
	case "get":
		client := http.Client{Timeout: 5 * time.Second}
		if len(os.Args) > 3 {
			timeout, err := time.ParseDuration(os.Args[3])
			exitOn(err)
			client.Timeout = timeout
		}
		resp, err := client.Get(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(os.Stdout, resp.Body)
	case "cat":
		data, err := os.ReadFile(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_, _ = os.Stdout.Write(data)
	case "write":
		exitOn(os.WriteFile(os.Args[2], []byte(os.Args[3]), 0o644))
	case "udpserve":
		fs := flag.NewFlagSet("udpserve", flag.ExitOnError)
		listen := fs.String("listen", ":5353", "address to listen on")
		_ = fs.Parse(os.Args[2:])
		udpServe(*listen)
	case "udpget":
		// A fixed source port: the same flow every time, as a resolver's.
		conn, err := net.DialUDP("udp", &net.UDPAddr{Port: 40000}, mustResolveUDP(os.Args[2]))
		exitOn(err)
		defer conn.Close()
		_, err = conn.Write([]byte("ping"))
		exitOn(err)
		exitOn(conn.SetReadDeadline(time.Now().Add(2 * time.Second)))
		buf := make([]byte, 512)
		n, err := conn.Read(buf)
		exitOn(err)
		fmt.Println(string(buf[:n]))
	case "lookup":
		addrs, err := net.LookupHost(os.Args[2])
		exitOn(err)
		fmt.Println(strings.Join(addrs, " "))
	case "srv":
		_, srvs, err := net.LookupSRV(os.Args[2], os.Args[3], os.Args[4])
		exitOn(err)
		for _, s := range srvs {
			fmt.Println(s.Target, s.Port)
		}
	case "ptr":
		names, err := net.LookupAddr(os.Args[2])
		exitOn(err)
		fmt.Println(strings.Join(names, " "))
	case "cname":
		name, err := net.LookupCNAME(os.Args[2])
		exitOn(err)
		fmt.Println(name)
	case "firstanswer":
		fs := flag.NewFlagSet("firstanswer", flag.ExitOnError)
		host := fs.String("host", "", "Host header of the requests (default: the URL's)")
		ok := fs.Bool("ok", false, "wait for 200 OK, not for any answer")
		_ = fs.Parse(os.Args[2:])
		if fs.NArg() != 1 {
			exitOn(errors.New("usage: firstanswer [-host H] [-ok] URL"))
		}
		firstAnswer(fs.Arg(0), *host, *ok)
	case "sink":
		fs := flag.NewFlagSet("sink", flag.ExitOnError)
		listen := fs.String("listen", ":9000", "address to listen on")
		_ = fs.Parse(os.Args[2:])
		sink(*listen)
	case "blast":
		seconds, err := strconv.Atoi(os.Args[3])
		exitOn(err)
		blast(os.Args[2], time.Duration(seconds)*time.Second)
	case "dnsbench":
		n, err := strconv.Atoi(os.Args[3])
		if err == nil && n < 1 {
			err = errors.New("dnsbench: N must be at least 1")
		}
		exitOn(err)
		dnsBench(os.Args[2], n)
	case "httpbench":
		fs := flag.NewFlagSet("httpbench", flag.ExitOnError)
		host := fs.String("host", "", "Host header of the requests (default: the URL's)")
		conns := fs.Int("c", 16, "connections, each with one request at a time")
		_ = fs.Parse(os.Args[2:])
		var seconds int
		var err error
		if fs.NArg() != 2 {
			err = errors.New("usage: httpbench [-host H] [-c 16] URL SECONDS")
		} else if seconds, err = strconv.Atoi(fs.Arg(1)); err == nil && (seconds < 1 || *conns < 1) {
			err = errors.New("httpbench: SECONDS and -c must be at least 1")
		}
		exitOn(err)
		httpBench(fs.Arg(0), *host, *conns, time.Duration(seconds)*time.Second)
	case "exit":
		code, _ := strconv.Atoi(os.Args[2])
		fmt.Println("exiting with", code)
		os.Exit(code)
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}

func mustResolveUDP(addr string) *net.UDPAddr {
	a, err := net.ResolveUDPAddr("udp", addr)
	exitOn(err)
	return a
}

func udpServe(addr string) {
	host, _ := os.Hostname()
	conn, err := net.ListenPacket("udp", addr)
	exitOn(err)
	fmt.Println("serving UDP on", addr)
	buf := make([]byte, 512)
	for {
		_, from, err := conn.ReadFrom(buf)
		exitOn(err)
		_, _ = conn.WriteTo([]byte(host), from)
	}
}

func exitOn(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func serve(addr string) {
	host, _ := os.Hostname()
	fmt.Println("serving on", addr)
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s\n", host, r.RemoteAddr)
	})
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	if err := http.ListenAndServe(addr, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// firstAnswer starts a GET of url every 5 ms, each on a connection of its
// own, and prints the wall-clock time (unix milliseconds) at which the
// first answer arrived; it gives up after a minute. The tries overlap: one
// whose SYN was dropped (ICMP errors are rate-limited) must not hold up
// the next.
func firstAnswer(url, host string, ok bool) {
	client := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	exitOn(err)
	req.Host = host
	answered := make(chan time.Time, 1)
	try := func() {
		resp, err := client.Do(req.Clone(context.Background()))
		if err != nil {
			return
		}
		resp.Body.Close()
		if ok && resp.StatusCode != http.StatusOK {
			return
		}
		select {
		case answered <- time.Now():
		default:
		}
	}
	fmt.Println("polling", url)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	giveUp := time.After(time.Minute)
	for {
		go try()
		select {
		case t := <-answered:
			fmt.Println(t.UnixMilli())
			return
		case <-giveUp:
			exitOn(fmt.Errorf("%s did not answer within a minute", url))
		case <-tick.C:
		}
	}
}

// httpBench sends GETs of url on conns kept-alive connections, one request
// at a time each, for d, and prints what a load generator does: requests
// per second and latency quantiles of the 200 OK answers, and how many
// requests failed or got another status.
func httpBench(url, host string, conns int, d time.Duration) {
	transport := &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}
	client := http.Client{Timeout: 5 * time.Second, Transport: transport}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	exitOn(err)
	req.Host = host
	type result struct {
		took   []time.Duration
		failed int
	}
	results := make(chan result, conns)
	start := time.Now()
	end := start.Add(d)
	for range conns {
		go func() {
			var r result
			for time.Now().Before(end) {
				t0 := time.Now()
				resp, err := client.Do(req.Clone(context.Background()))
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err != nil || resp.StatusCode != http.StatusOK {
					r.failed++
					continue
				}
				r.took = append(r.took, time.Since(t0))
			}
			results <- r
		}()
	}
	var took []time.Duration
	failed := 0
	for range conns {
		r := <-results
		took = append(took, r.took...)
		failed += r.failed
	}
	elapsed := time.Since(start)
	if len(took) == 0 {
		exitOn(fmt.Errorf("httpbench: no 200 OK from %s in %s (%d failed)", url, d, failed))
	}
	slices.Sort(took)
	quantile := func(q float64) float64 {
		i := max(int(math.Ceil(q*float64(len(took))))-1, 0)
		return took[i].Seconds() * 1e3
	}
	fmt.Printf("%d requests, %.0f requests/s, p50 %.2f ms, p99 %.2f ms, %d failed\n",
		len(took), float64(len(took))/elapsed.Seconds(), quantile(0.5), quantile(0.99), failed)
}

func sink(addr string) {
	ln, err := net.Listen("tcp", addr)
	exitOn(err)
	fmt.Println("sinking TCP on", addr)
	for {
		conn, err := ln.Accept()
		exitOn(err)
		go func() {
			defer conn.Close()
			// Large reads, so that the sink is not what limits the rate.
			buf := make([]byte, 256<<10)
			for {
				if _, err := conn.Read(buf); err != nil {
					return
				}
			}
		}()
	}
}

// blast writes to a sink at addr for d, then waits until the sink has
// read everything, so the rate counts only bytes that arrived.
func blast(addr string, d time.Duration) {
	conn, err := net.Dial("tcp", addr)
	exitOn(err)
	defer conn.Close()
	buf := make([]byte, 256<<10)
	var sent int64
	start := time.Now()
	for time.Since(start) < d {
		n, err := conn.Write(buf)
		exitOn(err)
		sent += int64(n)
	}
	exitOn(conn.(*net.TCPConn).CloseWrite())
	// The sink closes its end once it has read our end of stream.
	if _, err := io.Copy(io.Discard, conn); err != nil && !errors.Is(err, net.ErrClosed) {
		exitOn(err)
	}
	fmt.Printf("%.1f MB/s\n", float64(sent)/time.Since(start).Seconds()/1e6)
}

// dnsBench resolves name to IPv4 addresses n times in a row with Go's own
// resolver, which caches nothing: every lookup is one A query to the
// nameserver of /etc/resolv.conf.
func dnsBench(name string, n int) {
	r := &net.Resolver{PreferGo: true}
	took := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		_, err := r.LookupNetIP(context.Background(), "ip4", name)
		exitOn(err)
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	quantile := func(q float64) float64 {
		i := max(int(math.Ceil(q*float64(len(took))))-1, 0)
		return took[i].Seconds() * 1e3
	}
	fmt.Printf("%d queries: p50 %.2f ms, p99 %.2f ms\n", n, quantile(0.5), quantile(0.99))
}
