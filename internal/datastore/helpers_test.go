package datastore

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kelp-dev/kelp/internal/pki"
)

// startReady starts a datastore, waits until it answers and closes it when
// the test ends.
func startReady(t *testing.T, cfg Config) *Datastore {
	t.Helper()
	return ready(t, "Start", func(ctx context.Context) (*Datastore, error) { return Start(ctx, cfg) })
}

// ready runs start, waits until its datastore answers and stops it when the
// test ends.
func ready(t *testing.T, name string, start func(context.Context) (*Datastore, error)) *Datastore {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := start(ctx)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() { stopWithin(t, d, 30*time.Second) })
	if err := d.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	return d
}

func stopWithin(t *testing.T, d *Datastore, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// put, get, putRevision and count go through an etcd client on the
// Backend, as the apiserver does.
func put(t *testing.T, be Backend, key, value string) {
	t.Helper()
	putRevision(t, be, key, value)
}

// putRevision puts key and returns the revision the put made.
func putRevision(t *testing.T, be Backend, key, value string) int64 {
	t.Helper()
	var rev int64
	withClient(t, be, func(ctx context.Context, cli *clientv3.Client) {
		resp, err := cli.Put(ctx, key, value)
		if err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
		rev = resp.Header.Revision
	})
	return rev
}

func get(t *testing.T, be Backend, key string) string {
	t.Helper()
	var value string
	withClient(t, be, func(ctx context.Context, cli *clientv3.Client) {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		if len(resp.Kvs) != 1 {
			t.Fatalf("get %s: %d values, want 1", key, len(resp.Kvs))
		}
		value = string(resp.Kvs[0].Value)
	})
	return value
}

func count(t *testing.T, be Backend, key string) int64 {
	t.Helper()
	var n int64
	withClient(t, be, func(ctx context.Context, cli *clientv3.Client) {
		resp, err := cli.Get(ctx, key, clientv3.WithCountOnly())
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		n = resp.Count
	})
	return n
}

// withClient calls use with a client of be and a 10 s deadline.
func withClient(t *testing.T, be Backend, use func(context.Context, *clientv3.Client)) {
	t.Helper()
	cli, err := newClient(be)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	use(ctx, cli)
}

func freePort(t *testing.T) int {
	t.Helper()
	return freePorts(t, 1)[0]
}

// freePorts returns n distinct ports free on 127.0.0.1 (freeLocalPorts).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports, err := freeLocalPorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// testCA is a throwaway certificate authority.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, name+".crt")
	writePEM(t, file, "CERTIFICATE", der)
	return &testCA{cert: cert, key: key, file: file}
}

var serial int64 = 100

// issue writes a leaf certificate and key signed by ca and returns their paths.
func (ca *testCA) issue(t *testing.T, dir, name string, usages []x509.ExtKeyUsage, ips ...string) pki.Pair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
	}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := pki.Pair{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
	writePEM(t, p.Cert, "CERTIFICATE", der)
	writePEM(t, p.Key, "EC PRIVATE KEY", keyDER)
	return p
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// etcdTestTLS makes the certificates the PKI package will make for etcd: a
// server CA that signs the server and apiserver-client certificates, and a
// peer CA whose certificates serve both ends of peer connections.
func etcdTestTLS(t *testing.T) EtcdTLS {
	t.Helper()
	dir := t.TempDir()
	server := newTestCA(t, dir, "etcd-server-ca")
	peer := newTestCA(t, dir, "etcd-peer-ca")
	return EtcdTLS{
		ServerCA: server.file,
		Server:   server.issue(t, dir, "etcd-server", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, "127.0.0.1"),
		PeerCA:   peer.file,
		Peer:     peer.issue(t, dir, "etcd-peer", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, "127.0.0.1"),
		Client:   server.issue(t, dir, "apiserver-etcd-client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}),
	}
}
