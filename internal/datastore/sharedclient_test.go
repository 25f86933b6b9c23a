package datastore

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apiserver/pkg/server/egressselector"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
)

// The apiserver's storage of every resource shares one connection to the
// datastore, closed when the last of them is destroyed
// (scripts/patches/apiserver-shared-etcd-client.patch): upstream dials once
// per resource.
func TestAPIServerStorageSharesOneConnection(t *testing.T) {
	d := startReady(t, Config{DataDir: t.TempDir()})
	sock := strings.TrimPrefix(d.Backend().Endpoints[0], "unix://")
	var dials, open atomic.Int32
	// The apiserver dials through an egress lookup where one is set: this
	// one counts the connections it makes and those still open.
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dialer net.Dialer
		conn, err := dialer.DialContext(ctx, "unix", sock)
		if err != nil {
			return nil, err
		}
		dials.Add(1)
		open.Add(1)
		return &countedConn{Conn: conn, open: &open}, nil
	}
	cfg := storagebackend.ConfigForResource{Config: storagebackend.Config{
		Type:   storagebackend.StorageTypeETCD3,
		Prefix: "/registry",
		Transport: storagebackend.TransportConfig{
			ServerList:   d.Backend().Endpoints,
			EgressLookup: func(egressselector.NetworkContext) (utilnet.DialFunc, error) { return dial, nil },
		},
		LeaseManagerConfig: etcd3.NewDefaultLeaseManagerConfig(),
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	resources := []string{"/pods", "/services", "/configmaps"}
	stores := make([]storage.Interface, len(resources))
	destroys := make([]factory.DestroyFunc, len(resources))
	for i, resource := range resources {
		s, destroy, err := factory.Create(cfg, nil, nil, resource)
		if err != nil {
			t.Fatalf("storage for %s: %v", resource, err)
		}
		stores[i], destroys[i] = s, destroy
	}
	// The first storage also checks, once per process, what the datastore
	// supports, on a connection of its own that it then closes.
	waitOpen(ctx, t, &open, 1, "the storage of 3 resources")

	destroys[0]()
	for i, s := range stores[1:] {
		if _, err := s.GetCurrentResourceVersion(ctx); err != nil {
			t.Fatalf("%s, once %s is destroyed: %v", resources[i+1], resources[0], err)
		}
	}
	waitOpen(ctx, t, &open, 1, "the storage of 2 resources")

	for _, destroy := range destroys[1:] {
		destroy()
	}
	waitOpen(ctx, t, &open, 0, "no storage")

	before := dials.Load()
	s, destroy, err := factory.Create(cfg, nil, nil, "/pods")
	if err != nil {
		t.Fatalf("storage made after the last was destroyed: %v", err)
	}
	defer destroy()
	if _, err := s.GetCurrentResourceVersion(ctx); err != nil {
		t.Fatalf("storage made after the last was destroyed: %v", err)
	}
	if dials.Load() == before {
		t.Fatal("storage made after the last was destroyed uses a closed connection")
	}
}

// waitOpen waits until open connections are want, and fails the test if
// they are not by the end of ctx.
func waitOpen(ctx context.Context, t *testing.T, open *atomic.Int32, want int32, what string) {
	t.Helper()
	for open.Load() != want {
		if ctx.Err() != nil {
			t.Fatalf("%s: %d connections open to the datastore, want %d", what, open.Load(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// countedConn takes itself off open when it first closes.
type countedConn struct {
	net.Conn
	open *atomic.Int32
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}
