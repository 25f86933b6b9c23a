package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/kubeargs"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/snapshot"
	"github.com/kelp-dev/kelp/internal/token"
)

// etcdPeerPort is where embedded etcd members reach each other.
const etcdPeerPort = 2380

// joined is what a server learned when it joined the cluster.
type joined struct {
	// initialCluster is the embedded etcd membership to start with; empty
	// when the member already has data, or the datastore is external.
	initialCluster string
	// agentToken is the cluster's agent token secret; empty: none.
	agentToken string
	// encryptionConfig is the cluster's Secrets encryption configuration;
	// empty: none.
	encryptionConfig []byte
}

// joinCluster makes this server one of the cluster's at cfg.JoinServer,
// the first time it starts: it gets the cluster's authorities and, on
// embedded etcd, a place in its membership. Once it has joined (its etcd
// member has data; on an external datastore, it has the cluster's CA) it
// starts from what it has and asks nothing, so it starts while the server
// it joined through is down. Refusals are final; a server that does not
// answer is asked again until ctx ends.
//
// local is the kind of datastore the data dir holds (datastore.LocalKind).
func joinCluster(ctx context.Context, cfg config.Server, local string) (joined, error) {
	tls := layout.Server(cfg.DataDir).TLS
	if cfg.JoinServer == "" {
		return joined{}, nil
	}
	if cfg.EmbeddedEtcd() && local == datastore.KindEtcd {
		return joined{}, nil
	}
	if _, err := os.Stat(pki.FilesIn(tls).ServerCA.Cert); !cfg.EmbeddedEtcd() && err == nil {
		return joined{}, nil
	}
	tok, err := token.Parse(cfg.Token, token.ServerUser)
	if err != nil {
		return joined{}, fmt.Errorf("--token: %w", err)
	}
	if tok.User != token.ServerUser {
		what := "an agent token"
		if token.IsBootstrap(tok.Secret) {
			what = "a token of `kelp token create`"
		}
		return joined{}, fmt.Errorf("--token is %s, which joins agents only: a server joins with the server token, from <data-dir>/server/token on a server of the cluster", what)
	}
	hostname, err := os.Hostname()
	if err != nil {
		return joined{}, fmt.Errorf("this machine's hostname: %w", err)
	}
	req := joinapi.ServerJoinRequest{
		Name:          cfg.NodeName,
		Hostname:      hostname,
		ClusterCIDR:   kubeargs.CIDRs(cfg.ClusterCIDRs),
		ServiceCIDR:   kubeargs.CIDRs(cfg.ServiceCIDRs),
		ClusterDomain: cfg.ClusterDomain,
	}
	if !cfg.DisableAgent {
		req.NodeName = cfg.Node.NodeName
	}
	if cfg.EmbeddedEtcd() {
		req.PeerURL = (&url.URL{Scheme: "https", Host: net.JoinHostPort(cfg.AdvertiseAddress.String(), strconv.Itoa(etcdPeerPort))}).String()
	}
	client := joinapi.Client{Server: cfg.JoinServer, Token: tok, CAFile: pki.FilesIn(tls).ServerCA.Cert}
	var resp joinapi.ServerJoinResponse
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		_, err = client.Post(ctx, joinapi.ServerJoinPath, req, &resp)
		if err == nil {
			break
		}
		if errors.Is(err, joinapi.ErrRefused) {
			return joined{}, fmt.Errorf("join %s: %w", cfg.JoinServer, err)
		}
		if err := joinapi.Wait(ctx, log, err, wait); err != nil {
			return joined{}, fmt.Errorf("join %s: %w", cfg.JoinServer, err)
		}
	}
	if resp.Datastore == datastore.KindEtcd && !cfg.EmbeddedEtcd() {
		return joined{}, errors.New("the cluster keeps its state in embedded etcd: start this server without --datastore-endpoint to run a member of it")
	}
	if err := pki.WriteAuthorities(tls, resp.Authorities); err != nil {
		return joined{}, err
	}
	log.WithField("server", cfg.JoinServer).Info("Joined the cluster's control plane")
	return joined{initialCluster: resp.InitialCluster, agentToken: resp.AgentToken, encryptionConfig: resp.EncryptionConfig}, nil
}

// ClusterReset makes the server's embedded etcd member a cluster of one,
// keeping its data, or, with a restore path, replaces its data with the
// snapshot first. It returns once the member has started and stopped
// again, so that the server can be started without --cluster-reset.
func ClusterReset(ctx context.Context, cfg config.Server) error {
	// The restore checks the snapshot against the CA of this data dir
	// before one would be made.
	if cfg.ClusterResetRestorePath != "" {
		if err := restoreEtcd(ctx, cfg); err != nil {
			return err
		}
	}
	local := datastore.LocalKind(cfg.DataDir)
	certs, err := pki.Ensure(pkiConfig(cfg, local))
	if err != nil {
		return err
	}
	if local != datastore.KindEtcd {
		return fmt.Errorf("--cluster-reset: %s holds no embedded etcd member to reset; it resets the etcd of a server that ran with --cluster-init or --server", cfg.DataDir)
	}
	dc := datastoreConfig(cfg, certs)
	dc.ForceNewCluster = cfg.ClusterResetRestorePath == ""
	store, err := datastore.Start(ctx, dc)
	if err != nil {
		return err
	}
	ready := store.WaitReady(ctx)
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := errors.Join(ready, store.Stop(stopCtx)); err != nil {
		return fmt.Errorf("--cluster-reset: %w", err)
	}
	log.Infof("The embedded etcd is now a cluster of one member, %s, with all its data. Start kelp server again without --cluster-reset. "+
		"On every other server: stop it, move its %s away, and start it with --server https://%s and the server token to join again",
		cfg.NodeName, datastore.EtcdDir(cfg.DataDir), net.JoinHostPort(cfg.AdvertiseAddress.String(), strconv.Itoa(cfg.HTTPSPort)))
	return nil
}

// restoreEtcd replaces the member's data with the snapshot that
// --cluster-reset-restore-path names, once it is verified.
func restoreEtcd(ctx context.Context, cfg config.Server) error {
	dir := snapshot.Dir{DataDir: cfg.DataDir, Path: cfg.Snapshots.Dir, Node: cfg.NodeName, Token: cfg.Token}
	found, err := dir.Find(ctx, cfg.ClusterResetRestorePath, cfg.Snapshots.S3)
	if err != nil {
		return fmt.Errorf("--cluster-reset-restore-path: %w", err)
	}
	if found.FetchedFrom != "" {
		log.WithFields(logrus.Fields{"from": found.FetchedFrom, "into": found.Path}).Info("Fetched the snapshot")
	}
	res, err := dir.Restore(found.Path, snapshot.Target{Kind: datastore.KindEtcd, Member: datastore.EtcdMember{Name: cfg.NodeName, AdvertiseIP: cfg.AdvertiseAddress.String()}})
	if err != nil {
		return fmt.Errorf("--cluster-reset-restore-path: %w", err)
	}
	log.WithFields(logrus.Fields{"snapshot": found.Path, "previous": res.Backup}).Info("Restored the embedded etcd from the snapshot")
	return nil
}
