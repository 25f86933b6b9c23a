package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/token"
)

// tokenFiles are where the tokens nodes join with are kept.
type tokenFiles struct {
	server, agent string
}

func tokenPaths(dataDir string) tokenFiles {
	dir := filepath.Join(dataDir, "server")
	return tokenFiles{server: filepath.Join(dir, "token"), agent: filepath.Join(dir, "agent-token")}
}

// ensureTokens keeps the join tokens in <data-dir>/server: token (joins
// anything) and, with --agent-token, agent-token (joins agents only), each
// pinned to the server CA.
func ensureTokens(cfg config.Server, certs pki.Files) (tokenFiles, error) {
	ca, err := os.ReadFile(certs.ServerCA)
	if err != nil {
		return tokenFiles{}, fmt.Errorf("read server CA: %w", err)
	}
	hash := pki.CAHash(ca)
	files := tokenPaths(cfg.DataDir)
	if _, err := token.Ensure(files.server, token.ServerUser, cfg.Token, hash); err != nil {
		return tokenFiles{}, err
	}
	if cfg.AgentToken == "" {
		// An agent token given once and dropped since must stop working.
		if err := os.Remove(files.agent); err != nil && !os.IsNotExist(err) {
			return tokenFiles{}, fmt.Errorf("remove %s: %w", files.agent, err)
		}
		return files, nil
	}
	if _, err := token.Ensure(files.agent, token.NodeUser, cfg.AgentToken, hash); err != nil {
		return tokenFiles{}, err
	}
	return files, nil
}

// agentConfig is what joining nodes learn of the cluster.
func agentConfig(cfg config.Server) joinapi.AgentConfig {
	return joinapi.AgentConfig{
		Servers:              []string{"https://" + net.JoinHostPort(cfg.AdvertiseAddress.String(), strconv.Itoa(cfg.HTTPSPort))},
		ClusterCIDR:          cfg.ClusterCIDR.String(),
		ServiceCIDR:          cfg.ServiceCIDR.String(),
		ClusterDNS:           cfg.ClusterDNS.String(),
		ClusterDomain:        cfg.ClusterDomain,
		Overlay:              cfg.Overlay.Backend,
		DisableDNS:           cfg.Disable.CoreDNS,
		DisableNetworkPolicy: cfg.Disable.NetworkPolicy,
	}
}

// ensureJoinAPIAccess lets anyone reach the join API's paths: a node
// that joins has no credentials yet; the join checks its token.
func ensureJoinAPIAccess(ctx context.Context, adminKubeconfig string) error {
	c, err := adminClient(adminKubeconfig)
	if err != nil {
		return err
	}
	const name = "kelp:supervisor"
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{
			NonResourceURLs: []string{joinapi.CACertsPath, joinapi.PingPath, joinapi.JoinPath},
			Verbs:           []string{"get", "post"},
		}},
	}
	return createClusterRole(ctx, c, role,
		rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:unauthenticated"},
		rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:authenticated"})
}
