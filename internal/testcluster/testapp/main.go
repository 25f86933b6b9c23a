// Command testapp is the one program in the cluster tests' container image.
//
//	testapp serve [-listen :8080]  HTTP: / answers "<hostname> <client addr>", /healthz, /file?path=
//	testapp get URL                 print the body of an HTTP GET (exit 1 on failure)
//	testapp cat FILE                print a file
//	testapp exit CODE               exit with CODE (for Jobs)
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
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
	case "exit":
		code, _ := strconv.Atoi(os.Args[2])
		fmt.Println("exiting with", code)
		os.Exit(code)
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
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
