package config

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/layout"
)

// nodeInput holds the raw values of the flags every node has, whether
// `kelp server` runs it or `kelp agent`.
type nodeInput struct {
	configFile, dataDir, nodeName, privateRegistry, overlayIface  string
	debug                                                         bool
	nodeIPs, nodeExternalIPs, nodeLabels, nodeTaints, kubeletArgs cli.StringSlice
}

func nodeFlags(in *nodeInput) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", Aliases: []string{"c"}, EnvVars: []string{configFileEnv}, Value: DefaultConfigFile, Destination: &in.configFile,
			Usage: "config file (YAML, keys are long flag names); FILE.d/*.yaml are read after it"},
		&cli.BoolFlag{Name: "debug", Aliases: []string{"v"}, EnvVars: env("debug"), Destination: &in.debug, Usage: "log at debug level, including the Kubernetes components"},
		&cli.StringFlag{Name: "data-dir", Aliases: []string{"d"}, EnvVars: env("data-dir"), Value: layout.DefaultDataDir, Destination: &in.dataDir, Usage: "directory for state, certificates and the unpacked bundle"},
		&cli.StringFlag{Name: "node-name", EnvVars: env("node-name"), Destination: &in.nodeName, Usage: "node name (default: the hostname)"},
		&cli.StringSliceFlag{Name: "node-ip", EnvVars: env("node-ip"), Destination: &in.nodeIPs, Usage: "IP address of this node (default: detected from the default route)"},
		&cli.StringSliceFlag{Name: "node-external-ip", EnvVars: env("node-external-ip"), Destination: &in.nodeExternalIPs, Usage: "external IP address of this node (its ExternalIP); repeatable"},
		&cli.StringSliceFlag{Name: "node-label", EnvVars: env("node-label"), Destination: &in.nodeLabels, Usage: "label to register the node with, key=value"},
		&cli.StringSliceFlag{Name: "node-taint", EnvVars: env("node-taint"), Destination: &in.nodeTaints, Usage: "taint to register the node with, key=value:Effect"},
		&cli.StringFlag{Name: "private-registry", EnvVars: env("private-registry"), Value: "/etc/kelp/registries.yaml", Destination: &in.privateRegistry, Usage: "registry mirrors, auth and TLS (a missing file means none)"},
		&cli.StringFlag{Name: "overlay-iface", EnvVars: env("overlay-iface"), Destination: &in.overlayIface, Usage: "interface the overlay uses (default: the one with the node IP)"},
		&cli.StringSliceFlag{Name: "kubelet-arg", EnvVars: env("kubelet-arg"), Destination: &in.kubeletArgs, Usage: "extra kubelet flag, name=value"},
	}
}

// parse validates the node's own settings; the cluster's come from the
// server. Problems go to check.
func (in *nodeInput) parse(host Host, check func(error)) Agent {
	a := Agent{
		DataDir:         filepath.Clean(in.dataDir),
		NodeName:        strings.ToLower(in.nodeName),
		NodeLabels:      in.nodeLabels.Value(),
		NodeTaints:      in.nodeTaints.Value(),
		PrivateRegistry: in.privateRegistry,
		KubeletArgs:     in.kubeletArgs.Value(),
		Overlay:         Overlay{Iface: in.overlayIface},
		Debug:           in.debug,
	}
	if !filepath.IsAbs(in.dataDir) {
		check(fmt.Errorf("--data-dir %q: want an absolute path", in.dataDir))
	}
	if a.NodeName == "" {
		a.NodeName = strings.ToLower(host.Hostname)
	}
	for _, raw := range in.nodeIPs.Value() {
		ip, err := parseIP("--node-ip", raw)
		check(err)
		a.NodeIPs = append(a.NodeIPs, ip)
	}
	for _, raw := range in.nodeExternalIPs.Value() {
		ip, err := parseIP("--node-external-ip", raw)
		check(err)
		a.NodeExternalIPs = append(a.NodeExternalIPs, ip)
	}
	if len(a.NodeIPs) == 0 && host.IP.IsValid() {
		a.NodeIPs = []netip.Addr{host.IP}
	}
	for _, l := range a.NodeLabels {
		if k, _, ok := strings.Cut(l, "="); !ok || k == "" {
			check(fmt.Errorf("--node-label %q: want key=value", l))
		}
	}
	for _, taint := range a.NodeTaints {
		if kv, effect, ok := strings.Cut(taint, ":"); !ok || kv == "" || !slices.Contains([]string{"NoSchedule", "PreferNoSchedule", "NoExecute"}, effect) {
			check(fmt.Errorf("--node-taint %q: want key=value:Effect with Effect NoSchedule, PreferNoSchedule or NoExecute", taint))
		}
	}
	check(checkExtraArgs(a.KubeletArgs))
	return a
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
