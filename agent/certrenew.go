package agent

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/certrenew"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
)

// startCertRenewal renews, while it runs, the certificates of a node that
// joined, through the join API; the server's own node's are the server's,
// which renews them. The node's clients follow them by file
// (kubeconfig.WriteLocal).
func startCertRenewal(g *component.Group, cfg config.Agent, creds Credentials) error {
	p := layout.Agent(cfg.DataDir)
	// Only a node that joined keeps its credentials in the agent's TLS
	// directory; the server's own node uses the server's.
	if creds.Files != pki.NodeFilesIn(p.TLS) {
		return nil
	}
	// The server decides how long the leaves live; a test's minutes need
	// the clients to look for renewed ones as often.
	first := pki.NextExpiry(creds.Files.Leaves())
	certrenew.SpeedUpClientReload(first.NotAfter.Sub(first.RenewAt))

	data, err := os.ReadFile(p.NodePassword)
	if err != nil {
		return fmt.Errorf("read the node password: %w", err)
	}
	req := joinapi.JoinRequest{NodeName: cfg.NodeName, Password: strings.TrimSpace(string(data))}
	for _, ip := range cfg.NodeIPs {
		req.NodeIPs = append(req.NodeIPs, ip.String())
	}
	// The node's client certificate stands in for the token it joined
	// with, which may have expired or been rotated since.
	server := joinapi.Client{Server: creds.Server, CAFile: creds.Files.ServerCA, Cert: creds.Files.KubeletClient}
	var mu sync.Mutex
	renew := func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		return renewNode(ctx, server, req, creds.Files, p.SavedJoin)
	}
	if err := g.Go("certificate renewal", certrenew.Loop{Leaves: creds.Files.Leaves(), Renew: renew}.Run); err != nil {
		return err
	}
	return g.Go("CA rotation watch", func(ctx context.Context) error {
		return watchServerCA(ctx, server, renew)
	})
}

// caCheckInterval is how often a node asks its server whether the
// cluster's CAs changed (kelp certificate rotate-ca): one small GET.
const caCheckInterval = time.Minute

// watchServerCA renews the node's certificates, and with them its CA
// bundles, as soon as the server serves another server CA bundle than the
// node has: the server rotated its CAs, and the node's certificates and
// trust must follow before the old CAs are dropped.
func watchServerCA(ctx context.Context, server joinapi.Client, renew func(context.Context) error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(caCheckInterval):
		}
		served, err := server.CACerts(ctx)
		if err != nil {
			log.WithError(err).Debug("could not ask the server for its CA")
			continue
		}
		pinned, err := os.ReadFile(server.CAFile)
		if err != nil || bytes.Equal(served, pinned) {
			continue
		}
		log.Info("the cluster's CAs changed; renewing the node's certificates and CA bundles")
		if err := renew(ctx); err != nil && ctx.Err() == nil {
			log.WithError(err).Warn("renewing after a CA change failed; trying again in a minute")
		}
	}
}

// renewNode gets new certificates for the node from the join API and puts
// them where the node's components read them. The saved join goes first:
// a node that restarts without its server starts from it, and would put
// back certificates older than those in place.
//
// The server's CA bundles in the answer may differ from the node's: the
// server rotated its CAs. The answer came over a connection the node's
// own bundle verified, so the node takes them.
func renewNode(ctx context.Context, server joinapi.Client, req joinapi.JoinRequest, files pki.NodeFiles, savedPath string) error {
	var resp joinapi.JoinResponse
	_, err := server.Post(ctx, joinapi.JoinPath, req, &resp)
	if errors.Is(err, joinapi.ErrRefused) {
		// An expired certificate is refused too.
		return fmt.Errorf("%w; restarting kelp agent joins again with its token", err)
	}
	if err != nil {
		return err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(resp.ServerCA) || !x509.NewCertPool().AppendCertsFromPEM(resp.ClientCA) {
		return fmt.Errorf("join %s: the server's answer lacks its CA certificates", server.Server)
	}
	data, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(savedPath, data, 0o600); err != nil {
		return fmt.Errorf("save the renewed join: %w", err)
	}
	if err := files.WriteRenewed(resp.ServerCA, resp.ClientCA, resp.Certs); err != nil {
		return fmt.Errorf("save the renewed certificates: %w", err)
	}
	log.Info("renewed the node's certificates")
	return nil
}
