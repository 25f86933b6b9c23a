package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/profiling"
)

// Node is a node's own settings, the same whether `kelp server` runs the
// node or `kelp agent` does. Server and Agent embed it; Join holds it.
type Node struct {
	// DataDir and Debug belong to the whole process: on a server, the
	// control plane's too.
	DataDir         string
	NodeName        string
	NodeIPs         []netip.Addr
	NodeExternalIPs []netip.Addr
	NodeLabels      []string
	NodeTaints      []string
	PrivateRegistry string
	OverlayIface    string // uplink of the overlay; empty: the interface of the node IP
	KubeletArgs     []string
	Debug           bool
	// LocalStoragePath is where the node makes the directories of
	// local-path PersistentVolumes.
	LocalStoragePath string
	// PodManifests is the kubelet's static pod directory: pods that run
	// whether or not the apiserver is reachable.
	PodManifests string
	// ProtectKernelDefaults makes the kubelet require its kernel settings
	// instead of setting them (a CIS benchmark item).
	ProtectKernelDefaults bool
	// PprofAddress is the loopback address the process's profiles are
	// served at (package profiling); not valid: not served.
	PprofAddress netip.AddrPort
	// UpgradeAttempts is how many starts in a row an upgraded kelp gets
	// to become ready before the boot guard rolls the node back; 0:
	// never (package bootguard).
	UpgradeAttempts int
}

// nodeInput holds the values of a node's flags until parse validates them.
// Flags that need no conversion write straight into node, so that a new
// one is a field of Node and a flag in nodeFlags.
type nodeInput struct {
	node                                                          Node
	nodeIPs, nodeExternalIPs, nodeLabels, nodeTaints, kubeletArgs cli.StringSlice
	pprofAddress                                                  string
}

// ConfigFlag is --config. WithFileArgs reads the files before the flags
// are parsed; the flag is defined so that --help shows it, the parser
// accepts it, and WithFileArgs knows the command reads config files.
func ConfigFlag() cli.Flag {
	return &cli.StringFlag{Name: "config", Aliases: []string{"c"}, EnvVars: []string{configFileEnv}, Value: layout.ConfigFile,
		Usage: "config file (YAML, keys are long flag names); FILE.d/*.yaml are read after it"}
}

func nodeFlags(in *nodeInput) []cli.Flag {
	dataDir := DataDirFlag()
	dataDir.Destination = &in.node.DataDir
	return []cli.Flag{
		ConfigFlag(),
		&cli.BoolFlag{Name: "debug", Aliases: []string{"v"}, EnvVars: env("debug"), Destination: &in.node.Debug, Usage: "log at debug level, including the Kubernetes components"},
		dataDir,
		&cli.StringFlag{Name: "node-name", EnvVars: env("node-name"), Destination: &in.node.NodeName, Usage: "node name (default: the hostname)"},
		&cli.StringSliceFlag{Name: "node-ip", EnvVars: env("node-ip"), Destination: &in.nodeIPs, Usage: "IP address of this node, or an IPv4 and an IPv6 one, comma-separated, in a dual-stack cluster (default: detected from the default route)"},
		&cli.StringSliceFlag{Name: "node-external-ip", EnvVars: env("node-external-ip"), Destination: &in.nodeExternalIPs, Usage: "external IP address of this node (its ExternalIP); repeatable"},
		&cli.StringSliceFlag{Name: "node-label", EnvVars: env("node-label"), Destination: &in.nodeLabels, Usage: "label to register the node with, key=value"},
		&cli.StringSliceFlag{Name: "node-taint", EnvVars: env("node-taint"), Destination: &in.nodeTaints, Usage: "taint to register the node with, key=value:Effect"},
		&cli.StringFlag{Name: "private-registry", EnvVars: env("private-registry"), Value: layout.RegistriesFile, Destination: &in.node.PrivateRegistry, Usage: "registry mirrors, auth and TLS (a missing file means none)"},
		&cli.StringFlag{Name: "overlay-iface", EnvVars: env("overlay-iface"), Destination: &in.node.OverlayIface, Usage: "interface the overlay uses (default: the one with the node IP)"},
		&cli.StringFlag{Name: "default-local-storage-path", EnvVars: env("default-local-storage-path"), Destination: &in.node.LocalStoragePath, Usage: "directory of this node's local-path volumes (default: <data-dir>/storage)"},
		&cli.StringFlag{Name: "pod-manifests", EnvVars: env("pod-manifests"), Destination: &in.node.PodManifests, Usage: "directory of static pod manifests the kubelet runs even with the apiserver away (default: <data-dir>/agent/pod-manifests)"},
		&cli.BoolFlag{Name: "protect-kernel-defaults", EnvVars: env("protect-kernel-defaults"), Destination: &in.node.ProtectKernelDefaults, Usage: "do not let the kubelet change kernel settings; fail if they differ from what it needs (CIS benchmark)"},
		&cli.StringSliceFlag{Name: "kubelet-arg", EnvVars: env("kubelet-arg"), Destination: &in.kubeletArgs, Usage: "extra kubelet flag, name=value"},
		&cli.IntFlag{Name: "upgrade-attempts", EnvVars: env("upgrade-attempts"), Value: 3, Destination: &in.node.UpgradeAttempts, Usage: "starts in a row an upgraded kelp gets to become ready before it rolls the node back to kelp.previous (0: never)"},
		&cli.StringFlag{Name: "pprof-address", EnvVars: env("pprof-address"), Destination: &in.pprofAddress, Usage: "serve Go profiles of this kelp process (net/http/pprof) at this loopback address, e.g. 127.0.0.1:6060 (default: not served)"},
	}
}

// parse validates the node's own settings; the cluster's come from the
// server. Problems go to check.
func (in *nodeInput) parse(host Host, check func(error)) Node {
	n := in.node
	n.DataDir = filepath.Clean(in.node.DataDir)
	n.NodeLabels = List(in.nodeLabels.Value())
	n.NodeTaints = List(in.nodeTaints.Value())
	n.KubeletArgs = in.kubeletArgs.Value()
	if !filepath.IsAbs(in.node.DataDir) {
		check(fmt.Errorf("--data-dir %q: want an absolute path", in.node.DataDir))
	}
	n.LocalStoragePath = nodePath("--default-local-storage-path", n.LocalStoragePath, layout.Agent(n.DataDir).LocalStorage, check)
	n.PodManifests = nodePath("--pod-manifests", n.PodManifests, layout.Agent(n.DataDir).StaticPods, check)
	var err error
	n.NodeName, err = nodeName(in.node.NodeName, host.Hostname)
	check(err)
	for _, raw := range List(in.nodeIPs.Value()) {
		ip, err := parseIP("--node-ip", raw)
		check(err)
		n.NodeIPs = append(n.NodeIPs, ip)
	}
	for _, raw := range List(in.nodeExternalIPs.Value()) {
		ip, err := parseIP("--node-external-ip", raw)
		check(err)
		n.NodeExternalIPs = append(n.NodeExternalIPs, ip)
	}
	check(checkNodeIPs(n.NodeIPs))
	if len(n.NodeIPs) == 0 && host.IP.IsValid() {
		n.NodeIPs = []netip.Addr{host.IP}
	}
	for _, l := range n.NodeLabels {
		if k, _, ok := strings.Cut(l, "="); !ok || k == "" {
			check(fmt.Errorf("--node-label %q: want key=value", l))
		}
	}
	for _, taint := range n.NodeTaints {
		if kv, effect, ok := strings.Cut(taint, ":"); !ok || kv == "" || !slices.Contains([]string{"NoSchedule", "PreferNoSchedule", "NoExecute"}, effect) {
			check(fmt.Errorf("--node-taint %q: want key=value:Effect with Effect NoSchedule, PreferNoSchedule or NoExecute", taint))
		}
	}
	check(checkExtraArgs(n.KubeletArgs))
	if n.UpgradeAttempts < 0 {
		check(fmt.Errorf("--upgrade-attempts %d: want 0 (never roll back) or more", n.UpgradeAttempts))
	}
	if in.pprofAddress != "" {
		n.PprofAddress, err = pprofAddress(in.pprofAddress)
		check(err)
	}
	return n
}

// pprofAddress parses --pprof-address: host:port with a loopback IP or
// localhost.
func pprofAddress(raw string) (netip.AddrPort, error) {
	s := raw
	if host, port, err := net.SplitHostPort(raw); err == nil && host == "localhost" {
		s = net.JoinHostPort("127.0.0.1", port)
	}
	addr, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("--pprof-address %q: want a loopback address and port, e.g. 127.0.0.1:6060", raw)
	}
	if err := profiling.CheckAddress(addr); err != nil {
		return netip.AddrPort{}, fmt.Errorf("--pprof-address %w", err)
	}
	return addr, nil
}

// nodePath is the directory given with flag, or def without one.
func nodePath(flag, dir, def string, check func(error)) string {
	switch {
	case dir == "":
		return def
	case !filepath.IsAbs(dir):
		check(fmt.Errorf("%s %q: want an absolute path", flag, dir))
	}
	return filepath.Clean(dir)
}

// nodeNameHint says what a valid node name looks like.
const nodeNameHint = "pass --node-name with lowercase letters, digits, '-' and '.'"

// nodeName checks the name now, because Kubernetes refuses a Node whose
// name is not a DNS-1123 subdomain only once the kubelet registers it (or
// the join API once an agent joins). A name given with --node-name is used
// as written, so that the Node is called what the user typed; the hostname
// default is lowercased as kubeadm and k3s do, since its case means
// nothing to DNS.
func nodeName(flag, hostname string) (string, error) {
	// Lowercased, as the kubelet and k3s do, so a name that worked before
	// keeps naming the same node.
	if flag != "" {
		name := strings.ToLower(flag)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return "", fmt.Errorf("--node-name %q is not a valid node name: %s; %s", flag, strings.Join(errs, "; "), nodeNameHint)
		}
		return name, nil
	}
	if hostname == "" {
		return "", errors.New("this machine has no hostname to name the node after: pass --node-name")
	}
	name := strings.ToLower(hostname)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("the hostname %q is not a valid node name: %s; %s", hostname, strings.Join(errs, "; "), nodeNameHint)
	}
	return name, nil
}

// checkExtraArgs accepts name=value flags for an upstream component.
func checkExtraArgs(args []string) error {
	for _, arg := range args {
		if !strings.Contains(arg, "=") && strings.HasPrefix(arg, "-") {
			return fmt.Errorf("extra argument %q: write it as name=value without leading dashes, e.g. v=2", arg)
		}
	}
	return nil
}
