package datastore

import (
	"net"
	"path/filepath"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/wal"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
)

// What tools beside the server (kelp snapshot) need to know about the
// datastore a data dir holds, spelled once here.

// LocalKind returns KindEtcd when dataDir holds an embedded etcd member,
// KindSQLite when it holds a SQLite datastore, and "" when it holds
// neither: a server on an external datastore, or one never started.
func LocalKind(dataDir string) string {
	db := layout.Server(dataDir).DB
	switch {
	case wal.Exist(filepath.Join(EtcdDir(dataDir), "member", "wal")):
		return KindEtcd
	case exists(filepath.Join(db, stateDBName)):
		return KindSQLite
	}
	return ""
}

// EtcdDir is where the embedded etcd member of dataDir keeps its data.
func EtcdDir(dataDir string) string {
	return filepath.Join(layout.Server(dataDir).DB, etcdDirName)
}

// SQLitePath is where the SQLite datastore of dataDir is.
func SQLitePath(dataDir string) string {
	return filepath.Join(layout.Server(dataDir).DB, stateDBName)
}

// Lock takes the lock a running server holds on the datastore of dataDir,
// so it fails while one runs, and keeps a server from starting until
// release is called.
func Lock(dataDir string) (release func(), err error) {
	l, err := lockDir(layout.Server(dataDir).DB)
	if err != nil {
		return nil, err
	}
	return l.release, nil
}

// LocalEtcdClient returns a client to the embedded etcd member of dataDir on
// this host, with the certificate the apiserver uses.
func LocalEtcdClient(dataDir string) (*clientv3.Client, error) {
	return newClient(localEtcdBackend(dataDir))
}

// localEtcdBackend is how the apiserver of dataDir's server reaches its
// embedded etcd member.
func localEtcdBackend(dataDir string) Backend {
	f := pki.FilesIn(layout.Server(dataDir).TLS)
	return Backend{
		Endpoints: []string{"https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(defaultEtcdClientPort))},
		CAFile:    f.EtcdServerCA.Cert,
		CertFile:  f.EtcdClient.Cert,
		KeyFile:   f.EtcdClient.Key,
		Kind:      KindEtcd,
	}
}

// WitnessEtcdDir is where the etcd member of the witness (`kelp witness`)
// with the data dir dataDir keeps its data.
func WitnessEtcdDir(dataDir string) string {
	return filepath.Join(layout.Witness(dataDir).DB, etcdDirName)
}

// IsWitness says whether dataDir holds the etcd member of a witness.
func IsWitness(dataDir string) bool {
	return wal.Exist(filepath.Join(WitnessEtcdDir(dataDir), "member", "wal"))
}

// WitnessBackend is how a tool on the witness with the data dir dataDir
// reaches its member: on 127.0.0.1, with the witness's own certificate.
func WitnessBackend(dataDir string) Backend {
	f := pki.WitnessFilesIn(layout.Witness(dataDir).TLS)
	return Backend{
		Endpoints: []string{"https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(defaultEtcdClientPort))},
		CAFile:    f.EtcdServerCA,
		CertFile:  f.Server.Cert,
		KeyFile:   f.Server.Key,
		Kind:      KindEtcd,
	}
}
