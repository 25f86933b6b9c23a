package profiling

import (
	"context"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/component"
)

var log = logrus.WithField("component", "profiling")

// CheckAddress refuses an address that is not loopback: profiles show the
// process's internals, cost CPU while they are taken and have no
// authentication, so nothing off the machine may reach them (an SSH
// tunnel can).
func CheckAddress(addr netip.AddrPort) error {
	if !addr.Addr().IsLoopback() {
		return fmt.Errorf("%s is not a loopback address: profiles are served without authentication, so only on 127.0.0.1 or [::1] (from another machine, tunnel to it: ssh -L 6060:127.0.0.1:6060 …)", addr)
	}
	return nil
}

// Handler serves the profiles under /debug/pprof/, as net/http/pprof does
// on the default mux, which kelp does not serve.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Start listens on addr (see CheckAddress) and serves Handler there until
// stopped. A port in use fails here, before anything else starts.
func Start(addr netip.AddrPort) (*component.Running, error) {
	if err := CheckAddress(addr); err != nil {
		return nil, fmt.Errorf("--pprof-address %w", err)
	}
	l, err := net.Listen("tcp", addr.String())
	if err != nil {
		return nil, fmt.Errorf("serve profiles: %w (choose another --pprof-address)", err)
	}
	errorLog := log.WriterLevel(logrus.DebugLevel)
	srv := &http.Server{
		Handler:           Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		// No write timeout: a CPU profile or a trace answers only after
		// the seconds it was asked for.
		ErrorLog: stdlog.New(errorLog, "", 0),
	}
	log.WithField("address", "http://"+l.Addr().String()+"/debug/pprof/").Info("serving profiles")
	return component.Go("profiling", func(ctx context.Context) error {
		defer errorLog.Close()
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()
		select {
		case err := <-served:
			return fmt.Errorf("serve profiles: %w", err)
		case <-ctx.Done():
		}
		// A profile being taken is cut short: stopping is not held up by
		// a 60 s CPU profile.
		srv.Close()
		<-served
		return nil
	}), nil
}
