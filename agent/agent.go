package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

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
	"github.com/kelp-dev/kelp/internal/hostcheck"
	"github.com/kelp-dev/kelp/internal/images"
	"github.com/kelp-dev/kelp/internal/kubeconfig"
	"github.com/kelp-dev/kelp/internal/kubelet"
	"github.com/kelp-dev/kelp/internal/netpol"
	"github.com/kelp-dev/kelp/internal/nft"
	"github.com/kelp-dev/kelp/internal/overlay"
	"github.com/kelp-dev/kelp/internal/proxy"
	"github.com/kelp-dev/kelp/internal/registries"
)

var log = logrus.WithField("component", "agent")

// Credentials connect a node to its cluster. The server makes them for its
// own node.
type Credentials struct {
	Server                  string // apiserver URL
	ServerCA                string // verifies the apiserver
	ClientCA                string // verifies clients of the kubelet (the apiserver)
	KubeletCert, KubeletKey string // system:node:<name>
	ServingCert, ServingKey string // the kubelet's serving certificate
	ProxyCert, ProxyKey     string // system:kube-proxy, for the Service proxy
	DNSCert, DNSKey         string // system:kelp-dns, for the DNS server
	// system:kelp-controller, for NetworkPolicy enforcement
	ControllerCert, ControllerKey string
}

// Paths are where a node keeps its files, all derived from the data dir.
type Paths struct {
	Dir, BinDir, ImagesDir, ContainerdRoot, ContainerdConfig, ContainerdLog string
	RegistryDir, CNIConfDir, KubeletConfig, Kubeconfig, StaticPods          string
	ProxyKubeconfig, DNSKubeconfig, ControllerKubeconfig, Corefile          string
}

// PathsOf lays out <data-dir>/agent.
func PathsOf(dataDir string) Paths {
	dir := filepath.Join(dataDir, "agent")
	return Paths{
		Dir:                  dir,
		BinDir:               filepath.Join(dir, "bin"),
		ImagesDir:            filepath.Join(dir, "images"),
		ContainerdRoot:       filepath.Join(dir, "containerd"),
		ContainerdConfig:     filepath.Join(dir, "etc", "containerd", "config.toml"),
		ContainerdLog:        filepath.Join(dir, "containerd", "containerd.log"),
		RegistryDir:          filepath.Join(dir, "etc", "containerd", "certs.d"),
		CNIConfDir:           filepath.Join(dir, "etc", "cni", "net.d"),
		KubeletConfig:        filepath.Join(dir, "etc", "kubelet.yaml"),
		Kubeconfig:           filepath.Join(dir, "kubelet.kubeconfig"),
		ProxyKubeconfig:      filepath.Join(dir, "kubeproxy.kubeconfig"),
		DNSKubeconfig:        filepath.Join(dir, "dns.kubeconfig"),
		ControllerKubeconfig: filepath.Join(dir, "controller.kubeconfig"),
		Corefile:             filepath.Join(dir, "etc", "Corefile"),
		StaticPods:           filepath.Join(dir, "pod-manifests"),
	}
}

// RunDir holds kelp's runtime state: sockets, host-local leases.
const RunDir = "/run/kelp"

// Node is a running node.
type Node struct {
	containerd *containerd.Supervisor
	kubelet    *component.Running
	proxy      *component.Running
	dns        *dns.Server
	dnsCustom  *component.Running // nil with DNS disabled
	netpol     *component.Running // nil with network policy disabled
	overlay    *component.Running
	background *component.Running // image watch and pod network set-up
	client     *client.Client
}

// Start brings the node up: it returns once containerd answers and the
// kubelet has been launched; WaitReady waits for the kubelet.
func Start(ctx context.Context, cfg config.Agent, staged embed.Staged, creds Credentials) (_ *Node, err error) {
	host := hostcheck.Host{Root: "/"}
	p := PathsOf(cfg.DataDir)
	for _, d := range []string{p.Dir, p.BinDir, p.ImagesDir, p.ContainerdRoot, p.StaticPods, RunDir} {
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
	ccfg, err := containerdConfig(cfg, p, staged, systemd)
	if err != nil {
		return nil, err
	}
	if err := containerd.WriteConfig(p.ContainerdConfig, ccfg); err != nil {
		return nil, err
	}
	env := append(os.Environ(), "PATH="+p.BinDir+":"+staged.BinDir+":"+os.Getenv("PATH"))
	n := &Node{}
	n.containerd, err = containerd.Supervise(self, p.ContainerdConfig, p.ContainerdLog, env)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = n.Stop(stopCtx)
		}
	}()
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := containerd.WaitReady(readyCtx, containerd.Address); err != nil {
		return nil, fmt.Errorf("%w; see %s", err, p.ContainerdLog)
	}
	n.client, err = client.New(containerd.Address)
	if err != nil {
		return nil, fmt.Errorf("connect to containerd: %w", err)
	}
	importer := images.Importer{Client: n.client, Snapshotter: ccfg.Snapshotter, StatePath: filepath.Join(p.ContainerdRoot, "kelp-airgap-images.json")}
	if err := importer.EnsurePinned(ctx, staged.PauseImage, staged.PauseImageTar); err != nil {
		return nil, fmt.Errorf("import the pause image: %w", err)
	}
	if err := importer.SyncDir(ctx, p.ImagesDir); err != nil {
		log.WithError(err).Error("some airgap images were not imported")
	}

	if err := cni.EnableForwarding(); err != nil {
		return nil, err
	}
	if err := cni.EnsureMasquerade(cfg.ClusterCIDR); err != nil {
		return nil, err
	}

	if err := kubeconfig.Write(p.Kubeconfig, 0o600, kubeconfig.Client{Server: creds.Server, CAFile: creds.ServerCA, CertFile: creds.KubeletCert, KeyFile: creds.KubeletKey}); err != nil {
		return nil, err
	}
	if err := kubeconfig.Write(p.ProxyKubeconfig, 0o600, kubeconfig.Client{Server: creds.Server, CAFile: creds.ServerCA, CertFile: creds.ProxyCert, KeyFile: creds.ProxyKey}); err != nil {
		return nil, err
	}
	proxyClient, err := clientFor(p.ProxyKubeconfig)
	if err != nil {
		return nil, err
	}
	// Services work before the kubelet starts pods that use them.
	kube, err := clientFor(p.Kubeconfig)
	if err != nil {
		return nil, err
	}
	n.proxy = component.Go(context.WithoutCancel(ctx), "service proxy", func(ctx context.Context) error {
		return proxy.Run(ctx, proxyClient, proxy.Config{ClusterCIDR: cfg.ClusterCIDR, ClusterDNS: cfg.ClusterDNS, NodeName: cfg.NodeName, Pods: kube})
	})
	if !cfg.DisableDNS {
		if err := kubeconfig.Write(p.DNSKubeconfig, 0o600, kubeconfig.Client{Server: creds.Server, CAFile: creds.ServerCA, CertFile: creds.DNSCert, KeyFile: creds.DNSKey}); err != nil {
			return nil, err
		}
		n.dns, err = dns.Start(dns.Config{
			Address:    cfg.ClusterDNS,
			Domain:     cfg.ClusterDomain,
			Kubeconfig: p.DNSKubeconfig,
			ResolvConf: hostResolvConf(),
			Corefile:   p.Corefile,
		})
		if err != nil {
			return nil, err
		}
		dnsClient, err := clientFor(p.DNSKubeconfig)
		if err != nil {
			return nil, err
		}
		n.dnsCustom = component.Go(context.WithoutCancel(ctx), "dns customisation", func(ctx context.Context) error {
			return n.dns.WatchCustom(ctx, dnsClient)
		})
	}
	if err := kubeconfig.Write(p.ControllerKubeconfig, 0o600, kubeconfig.Client{Server: creds.Server, CAFile: creds.ServerCA, CertFile: creds.ControllerCert, KeyFile: creds.ControllerKey}); err != nil {
		return nil, err
	}
	controllerClient, err := clientFor(p.ControllerKubeconfig)
	if err != nil {
		return nil, err
	}
	if cfg.DisableNetworkPolicy {
		// Policies enforced before the user turned enforcement off would
		// stay in force forever.
		if err := removeNetworkPolicies(); err != nil {
			return nil, err
		}
	} else {
		n.netpol = component.Go(context.WithoutCancel(ctx), "network policy", func(ctx context.Context) error {
			return netpol.Run(ctx, controllerClient, netpol.Config{NodeName: cfg.NodeName})
		})
	}
	kcfg := kubelet.Config{
		NodeName:        cfg.NodeName,
		NodeIPs:         cfg.NodeIPs,
		Labels:          cfg.NodeLabels,
		Taints:          cfg.NodeTaints,
		Kubeconfig:      p.Kubeconfig,
		ConfigFile:      p.KubeletConfig,
		RuntimeEndpoint: "unix://" + containerd.Address,
		ClientCA:        creds.ClientCA,
		ServingCert:     creds.ServingCert,
		ServingKey:      creds.ServingKey,
		ClusterDNS:      cfg.ClusterDNS,
		ClusterDomain:   cfg.ClusterDomain,
		ResolvConf:      hostResolvConf(),
		StaticPodDir:    p.StaticPods,
		SystemdCgroups:  systemd,
		CgroupV1:        !host.CgroupV2(),
		ExtraArgs:       cfg.KubeletArgs,
	}
	if err := kubelet.WriteConfigFile(kcfg); err != nil {
		return nil, err
	}
	n.kubelet, err = kubelet.Start(context.WithoutCancel(ctx), kubelet.Args(kcfg))
	if err != nil {
		return nil, err
	}
	ocfg := overlay.Config{Backend: cfg.Overlay.Backend, NodeName: cfg.NodeName, NodeIP: cfg.NodeIPs[0], Iface: cfg.Overlay.Iface, ClusterCIDR: cfg.ClusterCIDR}
	if err := ocfg.Validate(); err != nil {
		return nil, err
	}
	mtu, err := overlay.MTU(ocfg)
	if err != nil {
		return nil, err
	}
	n.overlay = component.Go(context.WithoutCancel(ctx), "overlay", func(ctx context.Context) error {
		return overlay.Run(ctx, controllerClient, ocfg)
	})
	n.background = component.Go(context.WithoutCancel(ctx), "node network and images", func(ctx context.Context) error {
		if err := publishExternalIPs(ctx, kube, cfg.NodeName, cfg.NodeExternalIPs); err != nil {
			return err
		}
		cidr, err := cni.WaitPodCIDR(ctx, kube, cfg.NodeName)
		if err != nil {
			return err
		}
		if err := cni.WriteConflist(p.CNIConfDir, cidr, filepath.Join(RunDir, "cni", "networks"), mtu); err != nil {
			return err
		}
		log.WithField("podCIDR", cidr).Info("pod network configured")
		return importer.WatchDir(ctx, p.ImagesDir)
	})
	return n, nil
}

// containerdConfig decides containerd's settings for this host and writes
// the registry hosts files they point at.
func containerdConfig(cfg config.Agent, p Paths, staged embed.Staged, systemd bool) (containerd.Config, error) {
	reg, err := registries.Load(cfg.PrivateRegistry)
	if err != nil {
		return containerd.Config{}, err
	}
	if err := reg.WriteHosts(p.RegistryDir); err != nil {
		return containerd.Config{}, err
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
		State:               filepath.Join(RunDir, "containerd"),
		Address:             containerd.Address,
		RuncBinary:          filepath.Join(staged.BinDir, "runc"),
		CNIBinDir:           staged.BinDir,
		CNIConfDir:          p.CNIConfDir,
		RegistryDir:         p.RegistryDir,
		RegistryAuth:        reg.Auth(),
		SandboxImage:        staged.PauseImage,
		Snapshotter:         snapshotter,
		SystemdCgroup:       systemd,
		RestrictOOMScoreAdj: restrictOOM,
	}, nil
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

// WaitReady blocks until the kubelet serves its health check.
func (n *Node) WaitReady(ctx context.Context) error {
	return kubelet.WaitReady(ctx, n.kubelet)
}

// Err reports a failure of the kubelet, the Service proxy or the node's
// background work; containerd is restarted rather than reported.
func (n *Node) Err() <-chan error {
	errc := make(chan error, 1)
	// A nil channel is never ready: a disabled part never fails.
	var dnsErr, netpolErr <-chan error
	if n.dnsCustom != nil {
		dnsErr = n.dnsCustom.Err()
	}
	if n.netpol != nil {
		netpolErr = n.netpol.Err()
	}
	go func() {
		select {
		case err := <-dnsErr:
			errc <- err
		case err := <-netpolErr:
			errc <- err
		case err := <-n.kubelet.Err():
			errc <- err
		case err := <-n.background.Err():
			errc <- err
		case err := <-n.proxy.Err():
			errc <- err
		case err := <-n.overlay.Err():
			errc <- err
		}
	}()
	return errc
}

// Stop stops the node's processes and leaves its pods running: their
// shims outlive kelp, and the next start adopts them.
func (n *Node) Stop(ctx context.Context) error {
	var errs []error
	for _, r := range []*component.Running{n.background, n.kubelet, n.proxy, n.dnsCustom, n.netpol, n.overlay} {
		if r != nil {
			errs = append(errs, r.Stop(ctx))
		}
	}
	if n.dns != nil {
		errs = append(errs, n.dns.Stop())
	}
	if n.client != nil {
		n.client.Close()
	}
	if n.containerd != nil {
		errs = append(errs, n.containerd.Stop(ctx))
	}
	return errors.Join(errs...)
}

func removeNetworkPolicies() error {
	c, err := nft.New()
	if err != nil {
		return fmt.Errorf("netpol: %w", err)
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
