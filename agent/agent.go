package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/client"
	"github.com/sirupsen/logrus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kelp-dev/kelp/embed"
	"github.com/kelp-dev/kelp/internal/cni"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/containerd"
	"github.com/kelp-dev/kelp/internal/dns"
	"github.com/kelp-dev/kelp/internal/gateway"
	"github.com/kelp-dev/kelp/internal/hostcheck"
	"github.com/kelp-dev/kelp/internal/images"
	"github.com/kelp-dev/kelp/internal/informer"
	"github.com/kelp-dev/kelp/internal/kubeargs"
	"github.com/kelp-dev/kelp/internal/kubeconfig"
	"github.com/kelp-dev/kelp/internal/kubelet"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/mirror"
	"github.com/kelp-dev/kelp/internal/netpol"
	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/nodepaths"
	"github.com/kelp-dev/kelp/internal/overlay"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/proxy"
	"github.com/kelp-dev/kelp/internal/registries"
)

var log = logrus.WithField("component", "agent")

// Credentials connect a node to its cluster: the server's own node uses
// the files pki made for it, a joined node those it saved at its join.
type Credentials struct {
	Server string // apiserver URL
	Files  pki.NodeFiles
}

// Start adds the node's pieces to g, in order, and returns the kubelet once
// it is ready; ctx bounds the steps between the pieces.
func Start(ctx context.Context, g *component.Group, cfg config.Agent, staged embed.Staged, creds Credentials) (*kubelet.Kubelet, error) {
	host := hostcheck.Host{Root: "/"}
	if cfg.ProtectKernelDefaults {
		if err := host.CheckKernelDefaults(); err != nil {
			return nil, err
		}
	}
	p := layout.Agent(cfg.DataDir)
	for _, d := range []string{p.Dir, p.BinDir, p.ImagesDir, p.ContainerdRoot, cfg.PodManifests, layout.RunDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the kelp binary: %w", err)
	}
	if err := linkTools(p.BinDir, self); err != nil {
		return nil, err
	}
	systemd := systemdCgroups(host)
	ccfg, mirrored, err := containerdConfig(cfg, p, staged, systemd)
	if err != nil {
		return nil, err
	}
	if err := containerd.WriteConfig(p.ContainerdConfig, ccfg); err != nil {
		return nil, err
	}
	env := childEnviron(os.Environ(), p.BinDir+":"+staged.BinDir+":"+os.Getenv("PATH"))
	if err := g.Start(containerd.Supervise(filepath.Join(staged.BinDir, "containerd"), p.ContainerdConfig, p.ContainerdLog, env)); err != nil {
		return nil, err
	}
	images, err := startImages(ctx, ccfg, staged, p)
	if err := g.Start(images, err); err != nil {
		return nil, err
	}

	if err := cni.EnableForwarding(slices.ContainsFunc(cfg.ClusterCIDRs, func(p netip.Prefix) bool { return p.Addr().Is6() })); err != nil {
		return nil, err
	}
	if err := cni.EnsureMasquerade(cfg.ClusterCIDRs); err != nil {
		return nil, err
	}
	// Before any client is made: a test's short-lived certificates make the
	// clients look for renewed ones more often.
	if err := startCertRenewal(g, cfg, creds); err != nil {
		return nil, err
	}
	clients, err := writeClients(p, creds)
	if err != nil {
		return nil, err
	}
	// The node's controllers share one cache, under the controller
	// identity; it runs from before them until after they stop.
	informers := informer.New(clients.controller, trim(cfg.NodeName))
	if err := g.Go("node informer cache", informers.Run); err != nil {
		return nil, err
	}
	if len(mirrored) > 0 {
		m, err := mirror.Start(mirror.Config{
			NodeName:   cfg.NodeName,
			NodeIP:     cfg.NodeIPs[0],
			Registries: mirrored,
			Identity:   mirror.Identity{Cert: creds.Files.Controller, ClientCA: creds.Files.ClientCA},
			Containerd: layout.ContainerdAddress,
		}, informers)
		if err := g.Start(m, err); err != nil {
			return nil, err
		}
	}
	// Services work before the kubelet starts pods that use them.
	if err := g.Go("service proxy", func(ctx context.Context) error {
		return proxy.Run(ctx, clients.proxy, proxy.Config{ClusterCIDRs: cfg.ClusterCIDRs, ClusterDNS: cfg.ClusterDNS, NodeName: cfg.NodeName, Pods: clients.kubelet})
	}); err != nil {
		return nil, err
	}
	if !cfg.DisableDNS {
		if err := g.Start(dns.Start(dns.Config{
			Address:    cfg.ClusterDNS,
			Domain:     cfg.ClusterDomain,
			Kubeconfig: p.DNSKubeconfig,
			ResolvConf: hostResolvConf(),
			Corefile:   p.Corefile,
		}, clients.dns)); err != nil {
			return nil, err
		}
	}
	if cfg.DisableNetworkPolicy {
		// Policies enforced before the user turned enforcement off would
		// stay in force forever.
		if err := removeNetworkPolicies(); err != nil {
			return nil, err
		}
	} else if err := g.Go("network policy", func(ctx context.Context) error {
		return netpol.Run(ctx, informers, netpol.Config{NodeName: cfg.NodeName})
	}); err != nil {
		return nil, err
	}
	if cfg.DisableGateway {
		// Addresses a crash of the node's data path left would be
		// answered for here after another node took them over.
		if err := gateway.ReleaseRecorded(p.GatewayAddresses); err != nil {
			return nil, fmt.Errorf("release the Gateway addresses this node held: %w", err)
		}
	} else if err := g.Go("gateway", func(ctx context.Context) error {
		return gateway.Serve(ctx, clients.controller, informers, gateway.ServeConfig{NodeName: cfg.NodeName, AddressesFile: p.GatewayAddresses})
	}); err != nil {
		return nil, err
	}
	if err := startLocalStorage(g, cfg, clients.controller, informers); err != nil {
		return nil, err
	}
	ocfg := overlay.Config{Backend: cfg.Overlay, NodeName: cfg.NodeName, NodeIPs: cfg.NodeIPs, Iface: cfg.OverlayIface, ClusterCIDRs: cfg.ClusterCIDRs}
	if err := ocfg.Validate(); err != nil {
		return nil, fmt.Errorf("overlay: %w", err)
	}
	mtu, err := overlay.MTU(ocfg)
	if err != nil {
		return nil, fmt.Errorf("overlay: %w", err)
	}
	if err := g.Go("overlay", func(ctx context.Context) error {
		return overlay.Run(ctx, clients.controller, informers, ocfg)
	}); err != nil {
		return nil, err
	}
	// The pod network follows the node's pod CIDR, which the node gets
	// once its kubelet has registered it.
	if err := g.Go("pod network", func(ctx context.Context) error {
		if err := publishExternalIPs(ctx, clients.kubelet, cfg.NodeName, cfg.NodeExternalIPs); err != nil {
			return err
		}
		cidrs, err := cni.WaitPodCIDRs(ctx, clients.kubelet, cfg.NodeName)
		if err != nil {
			return err
		}
		if len(cidrs) < len(cfg.ClusterCIDRs) {
			log.WithField("podCIDRs", cidrs).Warnf("node %s has fewer pod ranges than the cluster has families (%s): a node registered before the cluster became dual-stack keeps its ranges; its pods get no address of the other family until the Node is deleted (kubectl delete node %s) and kelp restarted on it", cfg.NodeName, kubeargs.CIDRs(cfg.ClusterCIDRs), cfg.NodeName)
		}
		if err := cni.WriteConflist(p.CNIConfDir, cidrs, layout.CNINetworks, mtu); err != nil {
			return err
		}
		log.WithField("podCIDRs", cidrs).Info("pod network configured")
		<-ctx.Done()
		return nil
	}); err != nil {
		return nil, err
	}
	paths, kept, err := nodepaths.Ensure(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if kept {
		log.WithField("record", p.NodePaths).Infof("this node keeps the machine's pod cgroups (%s) and pod logs (%s), as before this kelp; another node on this machine must not use them: to give this node its own, run kelp killall and remove the record", paths.CgroupRoot, paths.PodLogsDir)
	}
	kcfg := kubelet.Config{
		NodeName:              cfg.NodeName,
		NodeIPs:               cfg.NodeIPs,
		Labels:                cfg.NodeLabels,
		Taints:                cfg.NodeTaints,
		Kubeconfig:            p.Kubeconfig,
		ConfigFile:            p.KubeletConfig,
		RuntimeEndpoint:       "unix://" + layout.ContainerdAddress,
		ClientCA:              creds.Files.ClientCA,
		Serving:               creds.Files.KubeletServing,
		ClusterDNS:            cfg.ClusterDNS,
		ClusterDomain:         cfg.ClusterDomain,
		ResolvConf:            hostResolvConf(),
		StaticPodDir:          cfg.PodManifests,
		SystemdCgroups:        systemd,
		CgroupV1:              !host.CgroupV2(),
		CgroupRoot:            paths.CgroupRoot,
		PodLogsDir:            paths.PodLogsDir,
		ProtectKernelDefaults: cfg.ProtectKernelDefaults,
		ExtraArgs:             cfg.KubeletArgs,
	}
	if err := kubelet.WriteConfigFile(kcfg); err != nil {
		return nil, err
	}
	k, err := kubelet.Start(kcfg)
	if err := g.Start(k, err); err != nil {
		return nil, err
	}
	if err := startUpgrades(g, cfg, p, self, clients.controller); err != nil {
		return nil, err
	}
	informers.Start()
	return k, nil
}

// clients are the node's API clients, one per identity.
type clients struct {
	kubelet, proxy, dns, controller kubernetes.Interface
}

// writeClients writes the node's kubeconfigs and makes a client of each.
func writeClients(p layout.AgentPaths, creds Credentials) (clients, error) {
	var c clients
	for _, k := range []struct {
		path   string
		cert   pki.Pair
		client *kubernetes.Interface
	}{
		{p.Kubeconfig, creds.Files.KubeletClient, &c.kubelet},
		{p.ProxyKubeconfig, creds.Files.Proxy, &c.proxy},
		{p.DNSKubeconfig, creds.Files.DNS, &c.dns},
		{p.ControllerKubeconfig, creds.Files.Controller, &c.controller},
	} {
		if err := kubeconfig.WriteLocal(k.path, kubeconfig.Client{Server: creds.Server, CAFile: creds.Files.ServerCA, Cert: k.cert}); err != nil {
			return clients{}, err
		}
		client, err := clientFor(k.path)
		if err != nil {
			return clients{}, err
		}
		*k.client = client
	}
	return c, nil
}

// startImages imports the pause image and the airgap images, then watches
// the images directory for more. It holds the node's containerd client.
func startImages(ctx context.Context, ccfg containerd.Config, staged embed.Staged, p layout.AgentPaths) (*component.Running, error) {
	c, err := client.New(layout.ContainerdAddress)
	if err != nil {
		return nil, fmt.Errorf("connect to containerd: %w", err)
	}
	importer := images.Importer{Client: c, Snapshotter: ccfg.Snapshotter, StatePath: p.AirgapImagesState}
	if err := importer.EnsurePinned(ctx, staged.PauseImage, staged.PauseImageTar); err != nil {
		c.Close()
		return nil, fmt.Errorf("import the pause image: %w", err)
	}
	if err := importer.SyncDir(ctx, p.ImagesDir); err != nil {
		log.WithError(err).Error("some airgap images were not imported")
	}
	return component.Go("airgap images", func(ctx context.Context) error {
		defer c.Close()
		return importer.WatchDir(ctx, p.ImagesDir)
	}), nil
}

// containerdConfig decides containerd's settings for this host and writes
// the registry hosts files they point at. It returns the registries the
// node shares with the others by the embedded registry mirror, if on.
func containerdConfig(cfg config.Agent, p layout.AgentPaths, staged embed.Staged, systemd bool) (containerd.Config, []string, error) {
	reg, err := registries.Load(cfg.PrivateRegistry)
	if err != nil {
		return containerd.Config{}, nil, err
	}
	var mirrored []string
	localMirror := ""
	if cfg.EmbeddedRegistry {
		mirrored = reg.Mirrored()
		if len(mirrored) == 0 {
			log.WithField("file", cfg.PrivateRegistry).Info("the cluster runs the embedded registry mirror, but this node mirrors no registry: list them under mirrors in its registries.yaml (\"*\" for all) to share their images with the other nodes")
		} else {
			localMirror = mirror.LocalEndpoint
		}
	}
	if err := reg.WriteHosts(p.RegistryDir, localMirror); err != nil {
		return containerd.Config{}, nil, err
	}
	snapshotter := "overlayfs"
	if err := containerd.OverlaySupported(p.ContainerdRoot); err != nil {
		log.WithError(err).Warn("overlayfs does not work here; containerd uses the native snapshotter (slower, more disk)")
		snapshotter = "native"
	}
	restrictOOM := !hasSysResource()
	if restrictOOM {
		log.Warn("kelp lacks CAP_SYS_RESOURCE (is it in a container?): containers get OOM scores no lower than kelp's own")
	}
	return containerd.Config{
		Root:                p.ContainerdRoot,
		State:               layout.ContainerdState,
		Address:             layout.ContainerdAddress,
		RuncBinary:          filepath.Join(staged.BinDir, "runc"),
		CNIBinDir:           staged.BinDir,
		CNIConfDir:          p.CNIConfDir,
		RegistryDir:         p.RegistryDir,
		RegistryAuth:        reg.Auth(),
		SandboxImage:        staged.PauseImage,
		Snapshotter:         snapshotter,
		SystemdCgroup:       systemd,
		RestrictOOMScoreAdj: restrictOOM,
	}, mirrored, nil
}

// CheckHost runs `kelp check-config`'s checks: a failure is an error that
// says how to fix it, a warning is logged.
func CheckHost() error {
	results := hostcheck.Host{Root: "/"}.Check()
	if err := hostcheck.Failures(results); err != nil {
		return err
	}
	for _, r := range results {
		if r.Status == hostcheck.Warn {
			log.WithField("fix", r.Fix).Warnf("%s: %s", r.Name, r.Detail)
		}
	}
	return nil
}

func removeNetworkPolicies() error {
	c, err := nft.New()
	if err != nil {
		return fmt.Errorf("remove network policies: %w", err)
	}
	return netpol.Remove(c)
}

func clientFor(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", kubeconfig, err)
	}
	return kubernetes.NewForConfig(rc)
}

// childEnviron is the environment of containerd, which its shims, runc and
// the CNI plugins inherit: kelp's own with path as PATH and without kelp's
// settings (KELP_*), which carry its secrets: the join token, a datastore
// endpoint's password, the S3 keys.
func childEnviron(environ []string, path string) []string {
	out := []string{"PATH=" + path}
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "KELP_") && !strings.HasPrefix(kv, "PATH=") {
			out = append(out, kv)
		}
	}
	return out
}
