package datastore

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kelp-dev/kelp/internal/layout"
)

// LocalBackend returns how a tool on this host, such as kelp etcdctl,
// reaches the datastore of the server whose data dir is dataDir: the
// embedded etcd member with the apiserver's client certificate, or kine's
// unix socket, which serves SQLite and also PostgreSQL and MySQL while that
// server runs. Kind is KindEtcd or KindSQLite; for PostgreSQL and MySQL,
// which leave nothing of theirs in the data dir, it is "". It fails when
// dataDir holds neither an etcd member nor a database or kine socket. A
// witness's member (`kelp witness`) is reached with its own certificate.
func LocalBackend(dataDir string) (Backend, error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return Backend{}, fmt.Errorf("resolve data dir %s: %w", dataDir, err)
	}
	switch LocalKind(abs) {
	case KindEtcd:
		return localEtcdBackend(abs), nil
	case KindSQLite:
		return Backend{Endpoints: []string{"unix://" + localKineSocket(abs)}, Kind: KindSQLite}, nil
	}
	if sock := localKineSocket(abs); isSocket(sock) {
		return Backend{Endpoints: []string{"unix://" + sock}}, nil
	}
	if IsWitness(abs) {
		return WitnessBackend(abs), nil
	}
	return Backend{}, fmt.Errorf("%s holds no datastore of a kelp server (no embedded etcd member, SQLite database or kine socket under %s)", abs, layout.Server(abs).DB)
}

// localKineSocket is where the kine of a server with the absolute data dir
// dataDir listens.
func localKineSocket(dataDir string) string {
	path, _ := kineSocketPath(layout.Server(dataDir).DB, layout.RunDir)
	return path
}

func isSocket(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&fs.ModeSocket != 0
}

// NewClient returns an etcd client for be, with its TLS files.
func NewClient(be Backend) (*clientv3.Client, error) { return newClient(be) }
