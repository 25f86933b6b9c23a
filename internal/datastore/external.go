package datastore

import (
	"fmt"
	"strings"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// externalEtcd is an etcd cluster kelp does not run; the apiserver talks to
// it directly, so there is nothing to start or stop.
type externalEtcd struct{}

func startExternalEtcd(cfg Config) (engine, string, Backend, error) {
	eps, err := etcdEndpoints(cfg.Endpoint)
	if err != nil {
		return nil, "", Backend{}, err
	}
	desc := "external etcd " + strings.Join(eps, ",")
	if cfg.CAFile != "" || cfg.CertFile != "" {
		info := transport.TLSInfo{TrustedCAFile: cfg.CAFile, CertFile: cfg.CertFile, KeyFile: cfg.KeyFile}
		if _, err := info.ClientConfig(); err != nil {
			return nil, "", Backend{}, fmt.Errorf("%s: load --datastore-cafile/--datastore-certfile/--datastore-keyfile: %w", desc, err)
		}
	}
	return externalEtcd{}, desc, Backend{
		Endpoints: eps,
		CAFile:    cfg.CAFile,
		CertFile:  cfg.CertFile,
		KeyFile:   cfg.KeyFile,
	}, nil
}

func (externalEtcd) failed() <-chan error { return nil }
func (externalEtcd) stop() error          { return nil }
