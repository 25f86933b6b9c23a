package datastore

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// A database that cannot be reached fails Start within the connect bound,
// with an error that names the endpoint but not its password.
func TestUnreachableRemoteDatabase(t *testing.T) {
	// A server that accepts connections and then says nothing, like a
	// firewall that swallows packets or a hung database.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	silentAddr := silent.Addr().String()

	for _, tc := range []struct {
		name, endpoint, shown, password string
	}{
		{"postgres refused", "postgres://u:p@127.0.0.1:1/db", "postgres://u:***@127.0.0.1:1/db", "u:p@"},
		{"postgres distinct password", "postgres://kelp:S3cr3t-pw@127.0.0.1:1/db", "postgres://kelp:***@127.0.0.1:1/db", "S3cr3t-pw"},
		{"postgres silent", "postgres://kelp:S3cr3t-pw@" + silentAddr + "/db", "postgres://kelp:***@" + silentAddr + "/db", "S3cr3t-pw"},
		{"mysql refused", "mysql://kelp:S3cr3t-pw@tcp(127.0.0.1:1)/db", "mysql://kelp:***@tcp(127.0.0.1:1)/db", "S3cr3t-pw"},
		{"mysql silent", "mysql://kelp:S3cr3t-pw@tcp(" + silentAddr + ")/db", "mysql://kelp:***@tcp(" + silentAddr + ")/db", "S3cr3t-pw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const bound = 3 * time.Second
			start := time.Now()
			d, err := Start(context.Background(), Config{DataDir: t.TempDir(), Endpoint: tc.endpoint, connectTimeout: bound})
			took := time.Since(start)
			if err == nil {
				stopWithin(t, d, 10*time.Second)
				t.Fatal("Start succeeded")
			}
			t.Logf("after %s: %v", took.Round(time.Millisecond), err)
			if took > bound+remoteAttemptTimeout/2 {
				t.Errorf("Start took %s with a %s bound", took, bound)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.shown) {
				t.Errorf("error does not name %s", tc.shown)
			}
			if strings.Contains(msg, tc.password) {
				t.Errorf("error shows the password %q", tc.password)
			}
			if !strings.Contains(msg, "reachable") {
				t.Errorf("error does not say what to check")
			}
		})
	}
}

// The Start context bounds the connection attempts too.
func TestRemoteDatabaseStartContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := Start(ctx, Config{DataDir: t.TempDir(), Endpoint: "postgres://u:p@127.0.0.1:1/db"})
	if err == nil {
		t.Fatal("Start succeeded")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Start took %s with a 1 s context", took)
	}
}
