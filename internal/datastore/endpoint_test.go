package datastore

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kelp-dev/kelp/internal/pki"
)

func TestEndpointKind(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		kind     string // "" means an error
	}{
		{"", KindSQLite},
		{"postgres://u:p@db.example:5432/kubernetes", KindPostgres},
		{"postgresql://u:p@db.example/kubernetes?sslmode=require", KindPostgres},
		{"postgres://u:p@h1,h2/db", KindPostgres},
		{"mysql://u:p@tcp(db.example:3306)/kubernetes", KindMySQL},
		{"https://10.0.0.1:2379", KindExternalEtcd},
		{"https://10.0.0.1:2379,https://10.0.0.2:2379", KindExternalEtcd},
		{"https://etcd-1.example:2379, https://etcd-2.example:2379", KindExternalEtcd},
		{"http://127.0.0.1:2379", KindExternalEtcd},
		{"https://", ""},
		{"https://u:p@10.0.0.1:2379", ""},
		{"https://10.0.0.1:2379/prefix", ""},
		{"https://10.0.0.1:2379,postgres://x", ""},
		{"postgres://", ""},
		{"mysql://", ""},
		{"sqlite:///var/lib/state.db", ""},
		{"nats://localhost:4222", ""},
		{"unix:///run/etcd.sock", ""},
		{"db.example:5432", ""},
	} {
		kind, err := endpointKind(tc.endpoint)
		switch {
		case tc.kind == "" && err == nil:
			t.Errorf("endpointKind(%q) = %q, want an error", tc.endpoint, kind)
		case tc.kind != "" && err != nil:
			t.Errorf("endpointKind(%q): %v", tc.endpoint, err)
		case kind != tc.kind:
			t.Errorf("endpointKind(%q) = %q, want %q", tc.endpoint, kind, tc.kind)
		}
		if err != nil && strings.Contains(err.Error(), ":p@") {
			t.Errorf("endpointKind(%q) error shows the password: %v", tc.endpoint, err)
		}
	}
}

func TestRedact(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"", ""},
		{"postgres://user:secret@db.example:5432/kubernetes", "postgres://user:***@db.example:5432/kubernetes"},
		{"postgres://user@db.example/kubernetes", "postgres://user@db.example/kubernetes"},
		{"postgres://db.example/kubernetes", "postgres://db.example/kubernetes"},
		{"postgres://user:p%40ss@db.example/k", "postgres://user:***@db.example/k"},
		{"postgres://user:pw@h1:5432,h2:5432/k", "postgres://user:***@h1:5432,h2:5432/k"},
		{"postgres://db.example/k?user=u&password=secret&sslmode=require", "postgres://db.example/k?user=u&password=***&sslmode=require"},
		{"postgres://db.example/k?sslpassword=keypw", "postgres://db.example/k?sslpassword=***"},
		{"mysql://root:secret@tcp(db.example:3306)/kubernetes", "mysql://root:***@tcp(db.example:3306)/kubernetes"},
		// The MySQL driver takes the last '@' before the last '/': passwords may hold both.
		{"mysql://root:se@c/ret@tcp(db.example:3306)/kubernetes", "mysql://root:***@tcp(db.example:3306)/kubernetes"},
		{"mysql://root:a:b@tcp(h)/k", "mysql://root:***@tcp(h)/k"},
		{"mysql://root@unix(/run/mysqld.sock)/k", "mysql://root@unix(/run/mysqld.sock)/k"},
		{"https://10.0.0.1:2379,https://10.0.0.2:2379", "https://10.0.0.1:2379,https://10.0.0.2:2379"},
		{"https://u:p@10.0.0.1:2379,https://v:q@10.0.0.2:2379", "https://u:***@10.0.0.1:2379,https://v:***@10.0.0.2:2379"},
		{"user:pw@tcp(h)/k", "user:***@tcp(h)/k"},
		{"db.example:5432", "db.example:5432"},
	} {
		if got := Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestScrubError(t *testing.T) {
	for _, tc := range []struct {
		endpoint, msg, want string
	}{
		{
			"postgres://kelp:hunter2@db/k",
			"cannot parse `postgres://kelp:hunter2@db/k`: bad",
			"cannot parse `postgres://kelp:***@db/k`: bad",
		},
		{
			"postgres://kelp:hunter2@db/k",
			"auth failed for password hunter2",
			"auth failed for password ***",
		},
		{
			"postgres://kelp:p%40ss@db/k",
			"password p@ss rejected",
			"password *** rejected",
		},
		{
			// Short passwords are hidden where they stand as user:password@,
			// not everywhere: "p" would eat every p in the message.
			"postgres://u:p@127.0.0.1:1/db",
			"failed to connect to `user=u database=db`: u:p@127.0.0.1:1 postgres",
			"failed to connect to `user=u database=db`: u:***@127.0.0.1:1 postgres",
		},
		{"", "untouched", "untouched"},
	} {
		inner := errors.New(tc.msg)
		err := scrubError(fmt.Errorf("wrapped: %w", inner), tc.endpoint)
		if got := err.Error(); got != "wrapped: "+tc.want {
			t.Errorf("scrubError(%q, %q) = %q, want %q", tc.msg, tc.endpoint, got, "wrapped: "+tc.want)
		}
		if !errors.Is(err, inner) {
			t.Errorf("scrubError(%q) lost the wrapped error", tc.msg)
		}
	}
}

func TestValidate(t *testing.T) {
	full := EtcdTLS{
		ServerCA: "s-ca", Server: pki.Pair{Cert: "s.crt", Key: "s.key"},
		PeerCA: "p-ca", Peer: pki.Pair{Cert: "p.crt", Key: "p.key"},
		Client: pki.Pair{Cert: "c.crt", Key: "c.key"},
	}
	noPeerKey := full
	noPeerKey.Peer.Key = ""
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string // "" means valid
	}{
		{"sqlite", Config{DataDir: "/var/lib/kelp"}, ""},
		{"no data dir", Config{}, "--data-dir"},
		{"external etcd needs no data dir", Config{Endpoint: "https://10.0.0.1:2379", CAFile: "ca", CertFile: "c", KeyFile: "k"}, ""},
		{"postgres", Config{DataDir: "/d", Endpoint: "postgres://u:p@db/k"}, ""},
		{"cert without key", Config{DataDir: "/d", Endpoint: "postgres://db/k", CertFile: "c"}, "together"},
		{"TLS files without endpoint", Config{DataDir: "/d", CAFile: "ca"}, "only used with --datastore-endpoint"},
		{"cluster-init", Config{DataDir: "/d", ClusterInit: true, EtcdTLS: full}, ""},
		{"cluster-init with endpoint", Config{DataDir: "/d", ClusterInit: true, Endpoint: "postgres://u:secret@db/k", EtcdTLS: full}, "cannot be combined"},
		{"cluster-init without peer key", Config{DataDir: "/d", ClusterInit: true, EtcdTLS: noPeerKey}, "peer key"},
		{"cluster-init bad advertise", Config{DataDir: "/d", ClusterInit: true, EtcdTLS: full, AdvertiseIP: "node-1"}, "not an IP"},
		{"bad scheme", Config{DataDir: "/d", Endpoint: "redis://x"}, "unsupported"},
	} {
		err := tc.cfg.Validate()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.wantErr)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: error shows the password: %v", tc.name, err)
		}
	}
}
