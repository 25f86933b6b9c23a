package witness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/token"
)

// PeerPort is where the other members reach the witness's etcd, as a
// server's.
const PeerPort = 2380

// stopTimeout bounds the stop of the witness's etcd member.
const stopTimeout = 30 * time.Second

var log = logrus.WithField("component", "witness")

// Run joins the cluster the first time and runs the witness's etcd member
// until ctx ends or the member fails.
func Run(ctx context.Context, cfg config.Witness) error {
	paths := layout.Witness(cfg.DataDir)
	files := pki.WitnessFilesIn(paths.TLS)
	peerURL := (&url.URL{Scheme: "https", Host: net.JoinHostPort(cfg.IP.String(), strconv.Itoa(PeerPort))}).String()
	var initialCluster string
	if !datastore.IsWitness(cfg.DataDir) {
		tok, err := joinToken(cfg)
		if err != nil {
			return err
		}
		resp, err := join(ctx, cfg, tok, peerURL)
		if err != nil {
			return err
		}
		if err := files.Write(resp.Certs); err != nil {
			return err
		}
		initialCluster = resp.InitialCluster
		log.WithField("server", cfg.Server).Info("Joined the cluster's etcd as a learner; a server promotes it to a voting member once it has caught up. The token file is no longer needed")
	}
	store, err := datastore.Start(ctx, datastore.Config{
		DataDir:        cfg.DataDir,
		DBDir:          paths.DB,
		ClusterInit:    true,
		InitialCluster: initialCluster,
		Name:           datastore.WitnessMember(cfg.Name),
		AdvertiseIP:    cfg.IP.String(),
		Witness:        true,
		EtcdTLS: datastore.EtcdTLS{
			ServerCA: files.EtcdServerCA,
			Server:   files.Server,
			PeerCA:   files.EtcdPeerCA,
			Peer:     files.Peer,
			// Its serving certificate is a client one too: the witness
			// holds no other certificate of the etcd server CA.
			Client: files.Server,
		},
	})
	if err != nil {
		return err
	}
	warnExpiry(files)
	// Its member is defragmented as a server's is: each member's file
	// counts against etcd's quota, and one that reaches it stops the
	// cluster's writes.
	be := datastore.WitnessBackend(cfg.DataDir)
	var wg sync.WaitGroup
	runCtx, stopRunning := context.WithCancel(ctx)
	wg.Go(func() { observe(runCtx, be, log) })
	wg.Go(func() {
		if err := datastore.Defrag(runCtx, be); err != nil {
			log.WithError(err).Warn("The witness's etcd member is not defragmented")
		}
	})
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-store.Err():
	}
	stopRunning()
	wg.Wait()
	stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	return errors.Join(runErr, store.Stop(stopCtx))
}

// joinToken is the server token a witness that has not joined yet needs.
func joinToken(cfg config.Witness) (token.Token, error) {
	if cfg.Token == "" {
		return token.Token{}, fmt.Errorf("this witness has not joined its cluster yet (%s holds no etcd member): give --token-file FILE, FILE holding the server token from <data-dir>/server/token on a server", datastore.WitnessEtcdDir(cfg.DataDir))
	}
	tok, err := token.Parse(cfg.Token, token.ServerUser)
	if err != nil {
		return token.Token{}, fmt.Errorf("--token-file: %w", err)
	}
	if tok.User != token.ServerUser || token.IsBootstrap(tok.Secret) {
		return token.Token{}, errors.New("--token-file holds a token that joins agents only: a witness, a voting member of the cluster's etcd, joins with the server token, from <data-dir>/server/token on a server")
	}
	return tok, nil
}

// join asks the server at cfg.Server for a place in the etcd membership.
// Refusals are final; a server that does not answer is asked again until
// ctx ends.
func join(ctx context.Context, cfg config.Witness, tok token.Token, peerURL string) (joinapi.WitnessJoinResponse, error) {
	// Nothing pinned: the witness keeps no server CA, as it never talks
	// to an apiserver again.
	client := joinapi.Client{Server: cfg.Server, Token: tok}
	req := joinapi.WitnessJoinRequest{Name: cfg.Name, PeerURL: peerURL}
	var resp joinapi.WitnessJoinResponse
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		_, err := client.Post(ctx, joinapi.WitnessJoinPath, req, &resp)
		if err == nil {
			return resp, nil
		}
		if errors.Is(err, joinapi.ErrRefused) {
			return joinapi.WitnessJoinResponse{}, fmt.Errorf("join %s: %w", cfg.Server, err)
		}
		if err := joinapi.Wait(ctx, log, err, wait); err != nil {
			return joinapi.WitnessJoinResponse{}, fmt.Errorf("join %s: %w", cfg.Server, err)
		}
	}
}

// warnExpiry says when the witness's certificates near their end: it has
// no way to renew them by itself.
func warnExpiry(files pki.WitnessFiles) {
	next := pki.NextExpiry(files.Leaves())
	if time.Now().Before(next.RenewAt) {
		return
	}
	log.WithFields(logrus.Fields{"cert": next.Cert, "expires": next.NotAfter.Format(time.RFC3339)}).Warn(
		"The witness's etcd certificates expire soon, and a witness does not renew them: remove its member with `kelp etcdctl member remove <id>` on a server, move this witness's data dir away, and join it again with --token-file")
}
