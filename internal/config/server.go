package config

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/token"
)

// Server is the validated configuration of `kelp server`.
type Server struct {
	// Node is the server's own node, run beside the control plane unless
	// DisableAgent.
	Node
	BindAddress      netip.Addr
	HTTPSPort        int
	AdvertiseAddress netip.Addr
	TLSSANs          []string
	// ClusterCIDRs and ServiceCIDRs are the pod and Service ranges: one,
	// or an IPv4 and an IPv6 one in a dual-stack cluster, the primary
	// family first.
	ClusterCIDRs         []netip.Prefix
	ServiceCIDRs         []netip.Prefix
	ServiceNodePortRange string
	// ClusterDNS is the cluster DNS Service's address, of the primary
	// family.
	ClusterDNS          netip.Addr
	ClusterDomain       string
	WriteKubeconfig     string
	WriteKubeconfigMode os.FileMode
	ClusterInit         bool
	Datastore           Datastore
	DisableAgent        bool
	Disable             Disable
	ExtraArgs           ExtraArgs
	// DisableRAMStore is --disable-ram-store: a server on SQLite keeps
	// Leases and Events in state.db too, instead of in its RAM store.
	DisableRAMStore bool
	// HelmAllowLocalRepos is --helm-allow-local-repos: HelmCharts may
	// fetch from loopback, link-local and cloud metadata addresses.
	HelmAllowLocalRepos bool
	// Token and AgentToken are the secrets nodes join with (--token,
	// --agent-token); empty: the token kept in the data dir, or none.
	Token, AgentToken string
	// Overlay is how pods on different nodes reach each other: "vxlan",
	// "host-gw" or "none".
	Overlay string
	// Snapshots are the scheduled snapshots of the datastore.
	Snapshots Snapshots
	// JoinServer is --server: the URL of a server of the cluster this one
	// joins, with Token; empty for a cluster's first server.
	JoinServer string
	// ClusterReset is --cluster-reset: make the embedded etcd member a
	// cluster of one, keeping its data (or the snapshot at
	// ClusterResetRestorePath), then exit.
	ClusterReset            bool
	ClusterResetRestorePath string
	// Audit is the apiserver's audit log; off without a LogPath.
	Audit Audit
	// SecretsEncryption is --secrets-encryption: Secrets are encrypted at
	// rest from the first start on. SecretsEncryptionGiven says the user
	// set it (flag, environment or config file), not the default: then it
	// also encrypts a cluster made without.
	SecretsEncryption, SecretsEncryptionGiven bool
	// EmbeddedRegistry is --embedded-registry: every node of the cluster
	// shares the images of the registries in its registries.yaml mirrors
	// with the others (package mirror).
	EmbeddedRegistry bool
	// GatewayAddressRanges are --gateway-address-range: Gateways get
	// addresses of their own from them, each held by one node; none:
	// every Gateway is on the nodes' own addresses.
	GatewayAddressRanges []AddressRange
	// PodSecurityDefault is --pod-security-default, the Pod Security
	// level of namespaces without their own: privileged, baseline or
	// restricted; empty: the cluster's default, which the server resolves
	// (apiserver.ResolvePodSecurity).
	PodSecurityDefault string
}

// Audit is --audit-log-path and its settings.
type Audit struct {
	LogPath                           string
	PolicyFile                        string // empty: kelp's default policy
	MaxSizeMB, MaxBackups, MaxAgeDays int
}

// EmbeddedEtcd says whether the server keeps its state in embedded etcd:
// the first server of such a cluster, one that joins it, or one being
// reset.
func (s Server) EmbeddedEtcd() bool {
	return s.ClusterInit || s.ClusterReset || (s.JoinServer != "" && s.Datastore.Endpoint == "")
}

// Datastore selects the storage behind the apiserver.
type Datastore struct {
	Endpoint                  string // empty: SQLite via kine
	CAFile, CertFile, KeyFile string
}

// Disable lists the built-in parts a user turned off with --disable.
type Disable struct {
	CoreDNS   bool // cluster DNS on every node
	ServiceLB bool // load balancer addresses for LoadBalancer Services
	// LocalStorage is the local-path StorageClass and its provisioner.
	LocalStorage bool
	// MetricsServer is the metrics.k8s.io API (kubectl top, HPA).
	MetricsServer bool
	// HelmController installs the charts of HelmChart objects.
	HelmController bool
	// Gateway is the Gateway API: its CRDs, the GatewayClass kelp, the
	// controller and every node's data path.
	Gateway bool
	// NetworkPolicy is --disable-network-policy: no enforcement on the
	// nodes, for a NetworkPolicy controller of the user's own.
	NetworkPolicy bool
}

// ExtraArgs are user flags appended to the control plane's generated ones,
// "name=value" each. The kubelet's are the node's KubeletArgs.
type ExtraArgs struct {
	APIServer, ControllerManager, Scheduler []string
}

// FirstServiceIP is the ClusterIP of the kubernetes Service: the first
// address of the primary Service range.
func (s Server) FirstServiceIP() netip.Addr {
	return s.ServiceCIDRs[0].Masked().Addr().Next()
}

// FirstServiceIPs are the first addresses of every Service range, which
// the apiserver's certificate names: a dual-stack kubernetes Service has
// one of each family.
func (s Server) FirstServiceIPs() []netip.Addr {
	ips := make([]netip.Addr, len(s.ServiceCIDRs))
	for i, p := range s.ServiceCIDRs {
		ips[i] = p.Masked().Addr().Next()
	}
	return ips
}

// ServerInput holds the raw flag values of `kelp server` until Parse
// validates them. Its zero value is ready for ServerFlags.
type ServerInput struct {
	nodeInput
	snapshotInput
	audit                                                                            Audit
	bindAddress, advertiseAddress                                                    string
	clusterCIDR, serviceCIDR, clusterDNS, clusterDomain                              string
	serviceNodePortRange                                                             string
	writeKubeconfig, writeKubeconfigMode                                             string
	datastoreEndpoint, datastoreCA, datastoreCert, datastoreKey                      string
	token, agentToken, overlay, joinServer, restorePath, podSecurityDefault          string
	tokenFile, agentTokenFile                                                        string
	httpsPort                                                                        int
	clusterInit, clusterReset, disableAgent, disableNetworkPolicy, secretsEncryption bool
	secretsEncryptionGiven                                                           bool
	disableRAMStore                                                                  bool
	helmAllowLocalRepos                                                              bool
	embeddedRegistry                                                                 bool
	tlsSANs, apiserverArgs, cmArgs, schedulerArgs, disable                           cli.StringSlice
	gatewayAddressRanges                                                             cli.StringSlice
}

// ServerFlags returns the flags of `kelp server`, bound to in.
func ServerFlags(in *ServerInput) []cli.Flag {
	return slices.Concat(nodeFlags(&in.nodeInput), snapshotFlags(&in.snapshotInput), []cli.Flag{
		&cli.StringFlag{Name: "bind-address", EnvVars: env("bind-address"), Value: "0.0.0.0", Destination: &in.bindAddress, Usage: "address the apiserver listens on"},
		&cli.IntFlag{Name: "https-listen-port", EnvVars: env("https-listen-port"), Value: 6443, Destination: &in.httpsPort, Usage: "port of the apiserver"},
		&cli.StringFlag{Name: "advertise-address", EnvVars: env("advertise-address"), Destination: &in.advertiseAddress, Usage: "address other members reach this server at (default: the node IP)"},
		&cli.StringSliceFlag{Name: "tls-san", EnvVars: env("tls-san"), Destination: &in.tlsSANs, Usage: "extra host name or IP in the apiserver's serving certificate"},
		&cli.StringFlag{Name: "cluster-cidr", EnvVars: env("cluster-cidr"), Value: "10.42.0.0/16", Destination: &in.clusterCIDR, Usage: "pod network; IPv4,IPv6 (either order, the first primary) for a dual-stack cluster"},
		&cli.StringFlag{Name: "service-cidr", EnvVars: env("service-cidr"), Value: "10.43.0.0/16", Destination: &in.serviceCIDR, Usage: "Service ClusterIP network; IPv4,IPv6 for a dual-stack cluster (an IPv6 range a /108 or smaller)"},
		&cli.StringFlag{Name: "service-node-port-range", EnvVars: env("service-node-port-range"), Value: "30000-32767", Destination: &in.serviceNodePortRange, Usage: "port range for NodePort Services"},
		&cli.StringFlag{Name: "cluster-dns", EnvVars: env("cluster-dns"), Destination: &in.clusterDNS, Usage: "cluster DNS Service IP (default: the 10th address of --service-cidr)"},
		&cli.StringFlag{Name: "cluster-domain", EnvVars: env("cluster-domain"), Value: "cluster.local", Destination: &in.clusterDomain, Usage: "cluster DNS domain"},
		&cli.StringFlag{Name: "write-kubeconfig", Aliases: []string{"o"}, EnvVars: env("write-kubeconfig"), Value: layout.Kubeconfig, Destination: &in.writeKubeconfig, Usage: "where to write the admin kubeconfig"},
		&cli.StringFlag{Name: "write-kubeconfig-mode", EnvVars: env("write-kubeconfig-mode"), Value: "0600", Destination: &in.writeKubeconfigMode, Usage: "file mode of the admin kubeconfig, octal"},
		&cli.BoolFlag{Name: "cluster-init", EnvVars: env("cluster-init"), Destination: &in.clusterInit, Usage: "store cluster state in embedded etcd instead of SQLite, so that more servers can join"},
		&cli.StringFlag{Name: "server", Aliases: []string{"s"}, EnvVars: []string{"KELP_URL"}, Destination: &in.joinServer, Usage: "join the control plane of the cluster this server belongs to, https://<server>:6443 (with --token: the server token)"},
		&cli.BoolFlag{Name: "cluster-reset", EnvVars: env("cluster-reset"), Destination: &in.clusterReset, Usage: "make this server's embedded etcd a cluster of one member, keeping its data, then exit (recovers from the loss of a majority of servers)"},
		&cli.StringFlag{Name: "cluster-reset-restore-path", EnvVars: env("cluster-reset-restore-path"), Destination: &in.restorePath, Usage: "with --cluster-reset: start from this etcd snapshot (a file, or the name of one in the snapshot dir or on S3)"},
		&cli.StringFlag{Name: "datastore-endpoint", EnvVars: env("datastore-endpoint"), Destination: &in.datastoreEndpoint, Usage: "external datastore: postgres://, mysql:// or https:// (etcd)"},
		&cli.StringFlag{Name: "datastore-cafile", EnvVars: env("datastore-cafile"), Destination: &in.datastoreCA, Usage: "CA bundle to verify the external datastore"},
		&cli.StringFlag{Name: "datastore-certfile", EnvVars: env("datastore-certfile"), Destination: &in.datastoreCert, Usage: "client certificate for the external datastore"},
		&cli.StringFlag{Name: "datastore-keyfile", EnvVars: env("datastore-keyfile"), Destination: &in.datastoreKey, Usage: "client key for the external datastore"},
		&cli.BoolFlag{Name: "disable-agent", EnvVars: env("disable-agent"), Destination: &in.disableAgent, Usage: "run the control plane only, no node"},
		&cli.StringSliceFlag{Name: "gateway-address-range", EnvVars: env("gateway-address-range"), Destination: &in.gatewayAddressRanges, Usage: "addresses on the nodes' network that Gateways get one each of (per family), held by one node at a time: first-last, a CIDR or an address; repeatable (default: Gateways share the nodes' addresses)"},
		&cli.StringSliceFlag{Name: "disable", EnvVars: env("disable"), Destination: &in.disable, Usage: "built-in part not to run: coredns, servicelb, local-storage, metrics-server, helm-controller or gateway; repeatable"},
		&cli.StringFlag{Name: "token", Aliases: []string{"t"}, EnvVars: env("token"), Destination: &in.token, Usage: "secret nodes join with (default: made at first start, kept in <data-dir>/server/token)"},
		&cli.StringFlag{Name: "agent-token", EnvVars: env("agent-token"), Destination: &in.agentToken, Usage: "secret that joins agents only (written to <data-dir>/server/agent-token)"},
		&cli.StringFlag{Name: "token-file", EnvVars: env("token-file"), Destination: &in.tokenFile, Usage: "file holding --token's secret (or, with --server, the join token)"},
		&cli.StringFlag{Name: "agent-token-file", EnvVars: env("agent-token-file"), Destination: &in.agentTokenFile, Usage: "file holding --agent-token's secret"},
		&cli.StringFlag{Name: "overlay", EnvVars: env("overlay"), Value: "vxlan", Destination: &in.overlay, Usage: "pod network between nodes: vxlan, host-gw (nodes on one L2 network) or none (bring your own CNI)"},
		&cli.BoolFlag{Name: "helm-allow-local-repos", EnvVars: env("helm-allow-local-repos"), Destination: &in.helmAllowLocalRepos, Usage: "let HelmCharts fetch charts from loopback, link-local and cloud metadata addresses (refused by default)"},
		&cli.BoolFlag{Name: "disable-ram-store", EnvVars: env("disable-ram-store"), Destination: &in.disableRAMStore, Usage: "on SQLite, keep Leases and Events on disk in the datastore instead of in RAM under /run/kelp"},
		&cli.BoolFlag{Name: "embedded-registry", EnvVars: env("embedded-registry"), Destination: &in.embeddedRegistry, Usage: "nodes pull images from each other before the registry, for the registries listed under mirrors in their registries.yaml (port 5001 between nodes)"},
		&cli.BoolFlag{Name: "disable-network-policy", EnvVars: env("disable-network-policy"), Destination: &in.disableNetworkPolicy, Usage: "do not enforce NetworkPolicies on the nodes"},
		&cli.StringFlag{Name: "audit-log-path", EnvVars: env("audit-log-path"), Destination: &in.audit.LogPath, Usage: "log the apiserver's requests to this file (default: no audit log)"},
		&cli.StringFlag{Name: "audit-policy-file", EnvVars: env("audit-policy-file"), Destination: &in.audit.PolicyFile, Usage: "audit policy (default: kelp's, who did what to which object, no bodies)"},
		&cli.IntFlag{Name: "audit-log-maxsize", EnvVars: env("audit-log-maxsize"), Value: 100, Destination: &in.audit.MaxSizeMB, Usage: "MiB at which the audit log is rotated"},
		&cli.IntFlag{Name: "audit-log-maxbackup", EnvVars: env("audit-log-maxbackup"), Value: 10, Destination: &in.audit.MaxBackups, Usage: "rotated audit logs kept"},
		&cli.IntFlag{Name: "audit-log-maxage", EnvVars: env("audit-log-maxage"), Value: 30, Destination: &in.audit.MaxAgeDays, Usage: "days a rotated audit log is kept"},
		&cli.BoolFlag{Name: "secrets-encryption", EnvVars: env("secrets-encryption"), Value: true, Destination: &in.secretsEncryption,
			Action: func(*cli.Context, bool) error { in.secretsEncryptionGiven = true; return nil },
			Usage:  "encrypt Secrets at rest in a new cluster (secretbox; see kelp secrets-encrypt); given on a single server whose Secrets are in the clear, it encrypts them; --secrets-encryption=false stores them in the clear"},
		&cli.StringFlag{Name: "pod-security-default", EnvVars: env("pod-security-default"), Destination: &in.podSecurityDefault, Usage: "Pod Security level enforced, warned and audited in namespaces without their own: privileged, baseline or restricted (default: baseline enforced and restricted warned; privileged on a cluster made by an earlier kelp)"},
		&cli.StringSliceFlag{Name: "kube-apiserver-arg", EnvVars: env("kube-apiserver-arg"), Destination: &in.apiserverArgs, Usage: "extra kube-apiserver flag, name=value"},
		&cli.StringSliceFlag{Name: "kube-controller-manager-arg", EnvVars: env("kube-controller-manager-arg"), Destination: &in.cmArgs, Usage: "extra kube-controller-manager flag, name=value"},
		&cli.StringSliceFlag{Name: "kube-scheduler-arg", EnvVars: env("kube-scheduler-arg"), Destination: &in.schedulerArgs, Usage: "extra kube-scheduler flag, name=value"},
	})
}

// env names the environment variable of a flag: data-dir → KELP_DATA_DIR.
func env(flag string) []string {
	return []string{"KELP_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))}
}

// Parse validates the flag values into a Server. host supplies the
// facts (hostname, node IP) used for defaults, so tests can fix them.
func (in *ServerInput) Parse(host Host) (Server, error) {
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	s := Server{
		Node:                    in.nodeInput.parse(host, check),
		HTTPSPort:               in.httpsPort,
		TLSSANs:                 List(in.tlsSANs.Value()),
		ServiceNodePortRange:    in.serviceNodePortRange,
		ClusterDomain:           in.clusterDomain,
		WriteKubeconfig:         in.writeKubeconfig,
		ClusterInit:             in.clusterInit,
		DisableAgent:            in.disableAgent,
		DisableRAMStore:         in.disableRAMStore,
		HelmAllowLocalRepos:     in.helmAllowLocalRepos,
		EmbeddedRegistry:        in.embeddedRegistry,
		Disable:                 Disable{NetworkPolicy: in.disableNetworkPolicy},
		JoinServer:              strings.TrimRight(in.joinServer, "/"),
		ClusterReset:            in.clusterReset,
		ClusterResetRestorePath: in.restorePath,
		Audit:                   in.audit,
		PodSecurityDefault:      in.podSecurityDefault,
		SecretsEncryption:       in.secretsEncryption,
		SecretsEncryptionGiven:  in.secretsEncryptionGiven,
		Overlay:                 in.overlay,
		Snapshots:               in.snapshotInput.parse(check),
		Datastore: Datastore{
			Endpoint: in.datastoreEndpoint,
			CAFile:   in.datastoreCA,
			CertFile: in.datastoreCert,
			KeyFile:  in.datastoreKey,
		},
		ExtraArgs: ExtraArgs{
			APIServer:         in.apiserverArgs.Value(),
			ControllerManager: in.cmArgs.Value(),
			Scheduler:         in.schedulerArgs.Value(),
		},
	}
	var err error
	s.Token, err = token.FromFlagOrFile("token", in.token, "token-file", in.tokenFile)
	check(err)
	s.AgentToken, err = token.FromFlagOrFile("agent-token", in.agentToken, "agent-token-file", in.agentTokenFile)
	check(err)
	for _, d := range List(in.disable.Value()) {
		switch d {
		case "coredns":
			s.Disable.CoreDNS = true
		case "servicelb":
			s.Disable.ServiceLB = true
		case "local-storage":
			s.Disable.LocalStorage = true
		case "metrics-server":
			s.Disable.MetricsServer = true
		case "helm-controller":
			s.Disable.HelmController = true
		case "gateway":
			s.Disable.Gateway = true
		default:
			check(fmt.Errorf("--disable %q: want coredns, servicelb, local-storage, metrics-server, helm-controller or gateway", d))
		}
	}
	check(checkOverlay(in.overlay))
	kept := layout.Server(s.DataDir)
	if in.joinServer == "" {
		// A joining server's token is the cluster's, checked where it
		// was chosen.
		check(checkChosen("--token", s.Token, kept.Token))
	}
	check(checkChosen("--agent-token", s.AgentToken, kept.AgentToken))
	if (in.joinServer == "" && strings.Contains(s.Token, "::")) || strings.Contains(s.AgentToken, "::") {
		check(errors.New("--token and --agent-token take the secret alone, not a full KELP1… token (a full token is for joining, with --server)"))
	}
	check(checkJoin(s, in))
	check(checkAudit(in.audit))
	if in.podSecurityDefault != "" && !slices.Contains([]string{"privileged", "baseline", "restricted"}, in.podSecurityDefault) {
		check(fmt.Errorf("--pod-security-default %q: want privileged, baseline or restricted", in.podSecurityDefault))
	}
	s.BindAddress, err = parseIP("--bind-address", in.bindAddress)
	check(err)
	if in.httpsPort < 1 || in.httpsPort > 65535 {
		check(fmt.Errorf("--https-listen-port %d: want a port between 1 and 65535", in.httpsPort))
	}
	s.ClusterCIDRs, err = ParseCIDRs("--cluster-cidr", in.clusterCIDR)
	check(err)
	s.ServiceCIDRs, err = ParseCIDRs("--service-cidr", in.serviceCIDR)
	check(err)
	check(checkNetworks(s.ClusterCIDRs, s.ServiceCIDRs, s.ExtraArgs.ControllerManager))
	if len(s.ServiceCIDRs) > 0 {
		s.ClusterDNS, err = clusterDNS(in.clusterDNS, s.ServiceCIDRs)
		check(err)
	}
	s.GatewayAddressRanges, err = ParseAddressRanges("--gateway-address-range", in.gatewayAddressRanges.Value())
	check(err)
	check(checkGatewayRanges(s))
	if !s.DisableAgent && len(s.ClusterCIDRs) > 0 && len(s.NodeIPs) > 0 {
		check(CheckNode(s.Node, host, s.ClusterCIDRs, s.ServiceCIDRs))
	}
	s.AdvertiseAddress, err = advertiseAddress(in.advertiseAddress, s.NodeIPs, s.ServiceCIDRs)
	check(err)
	check(checkPortRange(in.serviceNodePortRange))
	if in.clusterDomain == "" || strings.Trim(in.clusterDomain, ".") != in.clusterDomain {
		check(fmt.Errorf("--cluster-domain %q: want a domain like cluster.local", in.clusterDomain))
	}
	mode, err := strconv.ParseUint(in.writeKubeconfigMode, 8, 32)
	if err != nil || mode > 0o777 {
		check(fmt.Errorf("--write-kubeconfig-mode %q: want an octal file mode like 0600 or 0644", in.writeKubeconfigMode))
	}
	s.WriteKubeconfigMode = os.FileMode(mode)
	if in.clusterInit && in.datastoreEndpoint != "" {
		check(errors.New("--cluster-init and --datastore-endpoint exclude each other: embedded etcd or an external datastore, not both"))
	}
	check(checkEndpoint(in.datastoreEndpoint))
	for _, a := range [][]string{s.ExtraArgs.APIServer, s.ExtraArgs.ControllerManager, s.ExtraArgs.Scheduler} {
		check(checkExtraArgs(a))
	}
	if len(errs) > 0 {
		return Server{}, errors.Join(errs...)
	}
	return s, nil
}

// checkJoin checks --server and --cluster-reset against the rest.
func checkJoin(s Server, in *ServerInput) error {
	switch {
	case in.restorePath != "" && !in.clusterReset:
		return errors.New("--cluster-reset-restore-path is only used with --cluster-reset")
	case in.clusterReset && in.datastoreEndpoint != "":
		return errors.New("--cluster-reset resets embedded etcd; with --datastore-endpoint the datastore is external: reset it with its own tools")
	case in.joinServer == "":
		return nil
	case in.clusterInit:
		return errors.New("--server and --cluster-init exclude each other: --cluster-init starts a new cluster, --server joins one")
	case s.Token == "":
		return errors.New("--server needs --token: the server token, from <data-dir>/server/token on a server of the cluster")
	}
	if u, err := url.Parse(s.JoinServer); err != nil || u.Scheme != "https" || u.Host == "" || u.Path != "" {
		return fmt.Errorf("--server %q: want https://<server>:6443", in.joinServer)
	}
	return nil
}

func checkAudit(a Audit) error {
	switch {
	case a.LogPath == "" && a.PolicyFile != "":
		return errors.New("--audit-policy-file is used with --audit-log-path: give the log's path too")
	case a.LogPath != "" && !filepath.IsAbs(a.LogPath):
		return fmt.Errorf("--audit-log-path %q: want an absolute path", a.LogPath)
	case a.MaxSizeMB < 1 || a.MaxBackups < 0 || a.MaxAgeDays < 0:
		return errors.New("--audit-log-maxsize must be at least 1, --audit-log-maxbackup and --audit-log-maxage at least 0")
	}
	if a.PolicyFile != "" {
		if _, err := os.Stat(a.PolicyFile); err != nil {
			return fmt.Errorf("--audit-policy-file: %w", err)
		}
	}
	return nil
}

func checkOverlay(backend string) error {
	if !slices.Contains([]string{"vxlan", "host-gw", "none"}, backend) {
		return fmt.Errorf("--overlay %q: want vxlan, host-gw or none", backend)
	}
	return nil
}

func parseIP(flag, raw string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(raw)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s %q: not an IP address", flag, raw)
	}
	return ip, nil
}

func parseCIDR(flag, raw string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(raw)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s %q: not a CIDR like 10.42.0.0/16", flag, raw)
	}
	if p != p.Masked() {
		return netip.Prefix{}, fmt.Errorf("%s %q: host bits are set, did you mean %s?", flag, raw, p.Masked())
	}
	return p, nil
}

// advertiseAddress is --advertise-address, or the node IP of the primary
// Service family: the kubernetes Service, of that family, has the
// apiserver's advertised address as its endpoint, and kube-apiserver
// refuses one of the other family.
func advertiseAddress(raw string, nodeIPs []netip.Addr, services []netip.Prefix) (netip.Addr, error) {
	var primary netip.Prefix
	if len(services) > 0 {
		primary = services[0]
	}
	if raw != "" {
		ip, err := parseIP("--advertise-address", raw)
		if err == nil && primary.IsValid() && ip.Is6() != primary.Addr().Is6() {
			return ip, fmt.Errorf("--advertise-address %s: want an address of the primary Service range's family, as %s (the apiserver's address is the kubernetes Service's endpoint)", ip, primary)
		}
		return ip, err
	}
	for _, ip := range nodeIPs {
		if !primary.IsValid() || ip.Is6() == primary.Addr().Is6() {
			return ip, nil
		}
	}
	if len(nodeIPs) > 0 {
		return netip.Addr{}, fmt.Errorf("no node IP of the primary Service range's family (%s) to advertise the apiserver at: set --node-ip or --advertise-address", primary)
	}
	return netip.Addr{}, errors.New("no node IP found: set --node-ip or --advertise-address")
}

// clusterDNS defaults to the 10th address of the primary service network,
// as kubeadm and k3s do (10.43.0.10 for 10.43.0.0/16).
func clusterDNS(raw string, services []netip.Prefix) (netip.Addr, error) {
	if raw == "" {
		ip := services[0].Addr()
		for range 10 {
			ip = ip.Next()
		}
		return ip, nil
	}
	ip, err := parseIP("--cluster-dns", raw)
	if err != nil {
		return ip, err
	}
	if !services[0].Contains(ip) {
		return ip, fmt.Errorf("--cluster-dns %s is outside --service-cidr %s: give an address of the primary Service range", ip, services[0])
	}
	return ip, nil
}

func checkPortRange(raw string) error {
	lo, hi, ok := strings.Cut(raw, "-")
	l, err1 := strconv.Atoi(lo)
	h, err2 := strconv.Atoi(hi)
	if !ok || err1 != nil || err2 != nil || l < 1 || h > 65535 || l > h {
		return fmt.Errorf("--service-node-port-range %q: want a range like 30000-32767", raw)
	}
	return nil
}

func checkEndpoint(raw string) error {
	if raw == "" {
		return nil
	}
	for _, scheme := range []string{"postgres://", "postgresql://", "mysql://", "https://", "http://"} {
		if strings.HasPrefix(raw, scheme) {
			return nil
		}
	}
	return errors.New("--datastore-endpoint: want a postgres://, mysql:// or https:// (etcd) URL")
}

// checkChosen refuses a short secret chosen for a new cluster; for a
// cluster made with it before kelp asked for 16 characters (its token is
// kept at kept) it only warns: refusing would stop an upgraded server
// that its nodes and scripts join with that secret.
func checkChosen(flag, secret, kept string) error {
	err := token.CheckChosen(flag, secret)
	if err == nil {
		return nil
	}
	if fi, serr := os.Stat(kept); serr == nil && fi.Size() > 0 {
		logrus.WithField("component", "config").Warnf("%v; this cluster was made with it, so kelp goes on: choose a longer one (for --token, `kelp token rotate --new-token-file FILE`) and put it in this server's configuration", err)
		return nil
	}
	return err
}
