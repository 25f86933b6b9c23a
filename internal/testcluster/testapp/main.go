// Command testapp is the one program in the cluster tests' container image.
//
//	testapp serve [-listen :8080]  HTTP: / answers "<hostname> <client addr>", /healthz, /file?path=
//	testapp get URL [TIMEOUT]       print the body of an HTTP GET (exit 1 on failure; default timeout 5s)
//	testapp cat FILE                print a file
//	testapp exit CODE               exit with CODE (for Jobs)
//	testapp udpserve [-listen :5353] UDP: answer every datagram with the hostname
//	testapp udpget ADDR             send a datagram from UDP port 40000, print the answer
//	testapp lookup NAME             print the addresses NAME resolves to
//	testapp srv SERVICE PROTO NAME  print the SRV records as "target port"
//	testapp ptr IP                  print the names of IP
//	testapp cname NAME              print the canonical name of NAME
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
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
