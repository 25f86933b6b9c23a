package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kelp-dev/kelp/embed"
	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/bootguard"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/joinapi"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/loadbalancer"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/profiling"
	"github.com/kelp-dev/kelp/internal/token"
)

// Join makes this machine a node of the cluster at cfg.Server and runs it
// until ctx ends: it pins the server's CA by the token's hash, presents the
// token for the node's certificates and the cluster's settings, and starts
// the node. A node that joined before starts from what it got then when the
// server does not answer, so a restart keeps its pods while the server is
// away.
//
// A kelp of another version than the one that last became ready on the
// data dir is an upgrade on trial, which the boot guard rolls back to
// kelp.previous if it does not become ready within --upgrade-attempts
// starts (package bootguard).
func Join(ctx context.Context, cfg config.Join) error {
	guard, err := beginGuard(cfg.Node)
	if err != nil {
		return err
	}
	defer guard.Close()
	err = component.Run(ctx, "kelp agent", log, func(ctx context.Context, g *component.Group) error {
		if err := join(ctx, g, cfg); err != nil {
			return err
		}
		return guard.Ready()
	})
	return guard.Finish(err)
}

// beginGuard counts this start with the boot guard.
func beginGuard(node config.Node) (*bootguard.Guard, error) {
	if err := CheckWritable(node.DataDir); err != nil {
		return nil, err
	}
	return bootguard.BeginHere(node.DataDir, "agent", node.UpgradeAttempts)
}

func join(ctx context.Context, g *component.Group, cfg config.Join) error {
	tok, err := token.Parse(cfg.Token, token.NodeUser)
	if err != nil {
		return fmt.Errorf("join token: %w", err)
	}
	if err := CheckWritable(cfg.Node.DataDir); err != nil {
		return err
	}
	if cfg.Node.PprofAddress.IsValid() {
		if err := g.Start(profiling.Start(cfg.Node.PprofAddress)); err != nil {
			return err
		}
	}
	lbAddr := netip.MustParseAddrPort(LoadBalancerAddress)
	lbPort := Port{Addr: lbAddr.Addr(), Port: int(lbAddr.Port()), What: "the agent's load balancer"}
	if err := CheckPorts(append(NodePorts(), lbPort)); err != nil {
		return err
	}
	p := layout.Agent(cfg.Node.DataDir)
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", p.Dir, err)
	}
	password, err := nodePassword(p.NodePassword)
	if err != nil {
		return err
	}
	req := joinapi.JoinRequest{NodeName: cfg.Node.NodeName, Password: password, CIDRLists: true}
	for _, ip := range cfg.Node.NodeIPs {
		req.NodeIPs = append(req.NodeIPs, ip.String())
	}
	// The CA pinned at the first join is the one the node's credentials
	// trust from then on.
	files := pki.NodeFilesIn(p.TLS)
	resp, err := bootstrap(ctx, joinapi.Client{Server: cfg.Server, Token: tok, CAFile: files.ServerCA}, req, p.SavedJoin)
	if err != nil {
		return err
	}
	// The node reaches the apiserver through its own load balancer, which
	// knows every server.
	lb, err := loadbalancer.Start(LoadBalancerAddress, serverAddresses(cfg.Server, resp.Config.Servers))
	if err := g.Start(lb, err); err != nil {
		return err
	}
	if err := files.Write(resp.ServerCA, resp.ClientCA, resp.Certs); err != nil {
		return fmt.Errorf("save the credentials from the server: %w", err)
	}
	node, err := nodeConfig(cfg.Node, config.DetectHost(), resp.Config)
	if err != nil {
		return err
	}
	staged, err := embed.Stage(cfg.Node.DataDir)
	if err != nil {
		return err
	}
	began := time.Now()
	if _, err := Start(ctx, g, node, staged, Credentials{Server: "https://" + lb.Addr(), Files: files}); err != nil {
		return err
	}
	// The load balancer learns of servers added later from the cluster.
	follower, err := clientFor(p.ProxyKubeconfig)
	if err != nil {
		return err
	}
	if err := g.Go("apiserver list", func(ctx context.Context) error {
		return lb.Follow(ctx, follower, serverAddresses(cfg.Server, nil))
	}); err != nil {
		return err
	}
	log.WithFields(map[string]any{"node": node.NodeName, "server": cfg.Server, "took": time.Since(began).Round(time.Millisecond)}).Info("kelp node is running")
	return nil
}

// LoadBalancerAddress is where an agent's load balancer listens; the
// apiserver's certificate names 127.0.0.1.
const LoadBalancerAddress = "127.0.0.1:6444"

// serverAddresses lists the host:port of joined first, then of the other
// servers the server named.
func serverAddresses(joined string, servers []string) []string {
	var out []string
	for _, s := range append([]string{joined}, servers...) {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" || slices.Contains(out, u.Host) {
			continue
		}
		out = append(out, u.Host)
	}
	return out
}

// bootstrap gets the node's credentials from the server, trying again
// with backoff while it does not answer, or later when it asks to wait. Without the server, a node that
// joined before goes on with what it saved then.
func bootstrap(ctx context.Context, c joinapi.Client, req joinapi.JoinRequest, savedPath string) (joinapi.JoinResponse, error) {
	var saved *joinapi.JoinResponse
	if data, err := os.ReadFile(savedPath); err == nil {
		var r joinapi.JoinResponse
		if json.Unmarshal(data, &r) == nil {
			saved = &r
		}
	}
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		resp, err := joinOnce(ctx, c, req)
		if err == nil {
			data, err := json.Marshal(resp)
			if err == nil {
				err = atomicfile.Write(savedPath, data, 0o600)
			}
			return resp, err
		}
		if errors.Is(err, joinapi.ErrRefused) {
			return joinapi.JoinResponse{}, err
		}
		if saved != nil {
			log.WithError(err).Warn("cannot join now; the node starts with the credentials of its last join")
			return *saved, nil
		}
		if err := joinapi.Wait(ctx, log, err, wait); err != nil {
			return joinapi.JoinResponse{}, fmt.Errorf("join %s: %w", c.Server, err)
		}
	}
}

// joinOnce asks the server once. The node keeps as its server CA the one
// the join verified the server with, not the bundle in the answer: at a
// first join, the certificates the token's hash vouches for. A CA the
// server adds later reaches the node by watchServerCA, over connections
// this one verifies.
func joinOnce(ctx context.Context, c joinapi.Client, req joinapi.JoinRequest) (joinapi.JoinResponse, error) {
	var out joinapi.JoinResponse
	ca, err := c.Post(ctx, joinapi.JoinPath, req, &out)
	if err != nil {
		return joinapi.JoinResponse{}, err
	}
	out.ServerCA = ca
	return out, nil
}

// nodePassword is the node's own secret, made at its first join. A file
// too short for the server to take, as a power cut during an unsynced
// write leaves it, holds no secret to keep: a new one is made.
func nodePassword(path string) (string, error) {
	if data, err := os.ReadFile(path); err == nil {
		if password := strings.TrimSpace(string(data)); len(password) >= joinapi.MinPasswordLength {
			return password, nil
		}
		log.WithField("file", path).Warn("the node password file is empty or too short; making a new password. A server that knew the old one refuses this node until its password Secret is deleted, as the refusal says")
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read node password: %w", err)
	}
	password, err := token.Random()
	if err != nil {
		return "", err
	}
	return password, atomicfile.Write(path, []byte(password+"\n"), 0o600)
}

// nodeConfig completes the node's own settings with the cluster's.
// host is the machine the node runs on.
func nodeConfig(node config.Node, host config.Host, cluster joinapi.AgentConfig) (config.Agent, error) {
	a := config.Agent{
		Node:                 node,
		ClusterDomain:        cluster.ClusterDomain,
		Overlay:              cluster.Overlay,
		DisableDNS:           cluster.DisableDNS,
		DisableNetworkPolicy: cluster.DisableNetworkPolicy,
		EmbeddedRegistry:     cluster.EmbeddedRegistry,
		DisableGateway:       cluster.DisableGateway,
	}
	var err error
	if a.ClusterCIDRs, err = config.ParseCIDRs("the server's cluster CIDR", cluster.ClusterCIDR); err != nil {
		return config.Agent{}, err
	}
	if a.ClusterDNS, err = netip.ParseAddr(cluster.ClusterDNS); err != nil {
		return config.Agent{}, fmt.Errorf("the server's cluster DNS %q: %w", cluster.ClusterDNS, err)
	}
	var services []netip.Prefix
	if cluster.ServiceCIDR != "" { // empty from a server of an early kelp
		if services, err = config.ParseCIDRs("the server's service CIDR", cluster.ServiceCIDR); err != nil {
			return config.Agent{}, err
		}
	}
	if err := config.CheckNode(node, host, a.ClusterCIDRs, services); err != nil {
		return config.Agent{}, fmt.Errorf("this node cannot join the cluster: %w", err)
	}
	return a, nil
}
