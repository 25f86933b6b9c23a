package server

import (
	"cmp"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/kubeargs"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/token"
)

// tokenFiles are where the tokens nodes join with are kept.
type tokenFiles struct {
	server, agent string
}

func tokenPaths(dataDir string) tokenFiles {
	paths := layout.Server(dataDir)
	return tokenFiles{server: paths.Token, agent: paths.AgentToken}
}

// ensureTokens keeps the join tokens in <data-dir>/server: token (joins
// anything) and, with --agent-token or the cluster's agent token a joining
// server got (clusterAgent), agent-token (joins agents only), each pinned
// to the server CA.
func ensureTokens(cfg config.Server, certs pki.Files, clusterAgent string) (tokenFiles, error) {
	ca, err := os.ReadFile(certs.ServerCA.Cert)
	if err != nil {
		return tokenFiles{}, fmt.Errorf("read server CA: %w", err)
	}
	hash := pki.CAHash(ca)
	files := tokenPaths(cfg.DataDir)
	secret := cfg.Token
	if cfg.JoinServer != "" {
		// A joining server was given the whole token, or its secret.
		tok, err := token.Parse(cfg.Token, token.ServerUser)
		if err != nil {
			return tokenFiles{}, fmt.Errorf("--token: %w", err)
		}
		secret = tok.Secret
	}
	if _, err := token.Ensure(files.server, token.ServerUser, secret, hash); err != nil {
		return tokenFiles{}, err
	}
	agentSecret := cmp.Or(cfg.AgentToken, clusterAgent)
	if agentSecret == "" && cfg.JoinServer != "" {
		// The agent token came from the cluster when this server joined.
		return files, nil
	}
	if agentSecret == "" {
		// An agent token given once and dropped since must stop working.
		if err := os.Remove(files.agent); err != nil && !os.IsNotExist(err) {
			return tokenFiles{}, fmt.Errorf("remove %s: %w", files.agent, err)
		}
		return files, nil
	}
	if _, err := token.Ensure(files.agent, token.NodeUser, agentSecret, hash); err != nil {
		return tokenFiles{}, err
	}
	return files, nil
}

// agentConfig is what joining nodes learn of the cluster.
func agentConfig(cfg config.Server) joinapi.AgentConfig {
	return joinapi.AgentConfig{
		Servers:              []string{"https://" + net.JoinHostPort(cfg.AdvertiseAddress.String(), strconv.Itoa(cfg.HTTPSPort))},
		ClusterCIDR:          kubeargs.CIDRs(cfg.ClusterCIDRs),
		ServiceCIDR:          kubeargs.CIDRs(cfg.ServiceCIDRs),
		ClusterDNS:           cfg.ClusterDNS.String(),
		ClusterDomain:        cfg.ClusterDomain,
		Overlay:              cfg.Overlay,
		DisableDNS:           cfg.Disable.CoreDNS,
		DisableNetworkPolicy: cfg.Disable.NetworkPolicy,
		EmbeddedRegistry:     cfg.EmbeddedRegistry,
		DisableGateway:       cfg.Disable.Gateway,
	}
}
