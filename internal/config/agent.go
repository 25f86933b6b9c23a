package config

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/token"
)

// Agent is the validated configuration of a node: its own settings and
// the cluster's. The server decides the cluster's: from its flags for its
// own node, through the join API for an agent.
type Agent struct {
	Node
	// ClusterCIDRs are the pod ranges, the primary family first.
	ClusterCIDRs  []netip.Prefix
	ClusterDNS    netip.Addr
	ClusterDomain string
	Overlay       string // backend, see Server.Overlay
	DisableDNS    bool
	// DisableNetworkPolicy leaves NetworkPolicies to another controller.
	DisableNetworkPolicy bool
	// EmbeddedRegistry runs the registry mirror that nodes share images
	// by, for the registries of the node's registries.yaml mirrors.
	EmbeddedRegistry bool
	// DisableGateway runs no Gateway API data path on the node.
	DisableGateway bool
}

// Agent is the configuration of the server's own node.
func (s Server) Agent() Agent {
	return Agent{
		Node:                 s.Node,
		ClusterCIDRs:         s.ClusterCIDRs,
		ClusterDNS:           s.ClusterDNS,
		ClusterDomain:        s.ClusterDomain,
		Overlay:              s.Overlay,
		DisableDNS:           s.Disable.CoreDNS,
		DisableNetworkPolicy: s.Disable.NetworkPolicy,
		EmbeddedRegistry:     s.EmbeddedRegistry,
		DisableGateway:       s.Disable.Gateway,
	}
}

// Join is the validated configuration of `kelp agent`: where to join and
// the node's own settings. The cluster's settings (CIDRs, DNS, overlay)
// come from the server when the node joins.
type Join struct {
	Server string // https URL of a server
	Token  string // as given; see package token
	Node   Node
}

// AgentInput holds the raw flag values of `kelp agent` until Parse
// validates them. Its zero value is ready for AgentFlags.
type AgentInput struct {
	nodeInput
	server, token, tokenFile string
}

// AgentFlags returns the flags of `kelp agent`, bound to in.
func AgentFlags(in *AgentInput) []cli.Flag {
	return append(nodeFlags(&in.nodeInput),
		&cli.StringFlag{Name: "server", Aliases: []string{"s"}, EnvVars: []string{"KELP_URL"}, Destination: &in.server, Usage: "server to join, https://<server>:6443"},
		&cli.StringFlag{Name: "token", Aliases: []string{"t"}, EnvVars: env("token"), Destination: &in.token, Usage: "join token: one that joins agents only, made by 'kelp token create' on a server (or the server's <data-dir>/server/agent-token)"},
		&cli.StringFlag{Name: "token-file", EnvVars: env("token-file"), Destination: &in.tokenFile, Usage: "file holding the join token"},
	)
}

// Parse validates the flag values into a Join.
func (in *AgentInput) Parse(host Host) (Join, error) {
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	j := Join{Server: strings.TrimRight(in.server, "/"), Token: strings.TrimSpace(in.token), Node: in.nodeInput.parse(host, check)}
	u, err := url.Parse(j.Server)
	switch {
	case in.server == "":
		check(errors.New("--server is required: the URL of a server, https://<server>:6443"))
	case err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/"):
		check(fmt.Errorf("--server %q: want https://<server>:6443", in.server))
	}
	j.Token, err = token.FromFlagOrFile("token", in.token, "token-file", in.tokenFile)
	check(err)
	if j.Token == "" && len(errs) == 0 {
		check(errors.New("a join token is required: --token, --token-file or KELP_TOKEN, from `kelp token create` on a server"))
	}
	if len(j.Node.NodeIPs) == 0 {
		check(errors.New("no node IP found: set --node-ip"))
	}
	if len(errs) > 0 {
		return Join{}, errors.Join(errs...)
	}
	return j, nil
}
