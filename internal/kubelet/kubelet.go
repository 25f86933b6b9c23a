package kubelet

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/kubernetes/cmd/kubelet/app"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	kubeletconfiginternal "k8s.io/kubernetes/pkg/kubelet/apis/config"
	kubeletconfigvalidation "k8s.io/kubernetes/pkg/kubelet/apis/config/validation"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/eviction"
	"k8s.io/kubernetes/pkg/kubelet/kubeletconfig/configfiles"
	utilfs "k8s.io/kubernetes/pkg/util/filesystem"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/kubeargs"
	"github.com/kelp-dev/kelp/internal/pki"
)

// HealthzPort is where the kubelet serves /healthz, on loopback.
const HealthzPort = 10248

// Config is what the kubelet's configuration file and flags are built from.
type Config struct {
	NodeName        string
	NodeIPs         []netip.Addr
	Labels          []string // key=value
	Taints          []string // key=value:Effect
	Kubeconfig      string
	ConfigFile      string   // where the generated KubeletConfiguration goes
	RuntimeEndpoint string   // unix:///run/kelp/containerd/containerd.sock
	ClientCA        string   // verifies the apiserver's client certificate
	Serving         pki.Pair // the kubelet's serving certificate
	ClusterDNS      netip.Addr
	ClusterDomain   string
	ResolvConf      string
	StaticPodDir    string
	SystemdCgroups  bool
	CgroupV1        bool
	// CgroupRoot and PodLogsDir are the node's own (package nodepaths):
	// kubelets that share a cgroup or a pod log dir remove each other's
	// pod cgroups and logs.
	CgroupRoot, PodLogsDir string
	// ProtectKernelDefaults: fail instead of changing kernel settings.
	ProtectKernelDefaults bool
	ExtraArgs             []string
}

// Configuration returns the KubeletConfiguration kelp runs the kubelet with.
func Configuration(cfg Config) *kubeletv1beta1.KubeletConfiguration {
	driver := "cgroupfs"
	if cfg.SystemdCgroups {
		driver = "systemd"
	}
	return &kubeletv1beta1.KubeletConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"},
		Authentication: kubeletv1beta1.KubeletAuthentication{
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(false)},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(true)},
			X509:      kubeletv1beta1.KubeletX509Authentication{ClientCAFile: cfg.ClientCA},
		},
		Authorization:            kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook},
		CgroupDriver:             driver,
		ClusterDNS:               []string{cfg.ClusterDNS.String()},
		ClusterDomain:            cfg.ClusterDomain,
		ContainerRuntimeEndpoint: cfg.RuntimeEndpoint,
		TLSCertFile:              cfg.Serving.Cert,
		TLSPrivateKeyFile:        cfg.Serving.Key,
		HealthzBindAddress:       "127.0.0.1",
		HealthzPort:              ptr.To[int32](HealthzPort),
		ReadOnlyPort:             0,
		ResolverConfig:           ptr.To(cfg.ResolvConf),
		StaticPodPath:            cfg.StaticPodDir,
		CgroupRoot:               cfg.CgroupRoot,
		PodLogsDir:               cfg.PodLogsDir,
		SerializeImagePulls:      ptr.To(false),
		// Pods never use swap; a node that has swap keeps running, with a
		// warning from kelp, instead of refusing to start.
		FailSwapOn:            ptr.To(false),
		MemorySwap:            kubeletv1beta1.MemorySwapConfiguration{SwapBehavior: "NoSwap"},
		FailCgroupV1:          ptr.To(!cfg.CgroupV1),
		ProtectKernelDefaults: cfg.ProtectKernelDefaults,
	}
}

// Args returns the kubelet command line for cfg.
func Args(cfg Config) []string {
	flags := map[string]string{
		"config":            cfg.ConfigFile,
		"kubeconfig":        cfg.Kubeconfig,
		"hostname-override": cfg.NodeName,
		// The server's node address controller sets the node's addresses,
		// ExternalIP too, which the kubelet alone cannot (package
		// nodeaddress).
		"cloud-provider": "external",
	}
	if len(cfg.NodeIPs) > 0 {
		ips := make([]string, len(cfg.NodeIPs))
		for i, ip := range cfg.NodeIPs {
			ips[i] = ip.String()
		}
		flags["node-ip"] = strings.Join(ips, ",")
	}
	if len(cfg.Labels) > 0 {
		flags["node-labels"] = strings.Join(cfg.Labels, ",")
	}
	if len(cfg.Taints) > 0 {
		flags["register-with-taints"] = strings.Join(cfg.Taints, ",")
	}
	return kubeargs.Render(flags, cfg.ExtraArgs)
}

// WriteConfigFile writes Configuration(cfg) to cfg.ConfigFile.
func WriteConfigFile(cfg Config) error {
	data, err := yaml.Marshal(Configuration(cfg))
	if err != nil {
		return fmt.Errorf("render kubelet config: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(cfg.ConfigFile), 0o700); err != nil {
		return fmt.Errorf("write kubelet config: %w", err)
	}
	if err := atomicfile.Write(cfg.ConfigFile, data, 0o600); err != nil {
		return fmt.Errorf("write kubelet config: %w", err)
	}
	return nil
}

// Kubelet is a running kubelet.
type Kubelet struct {
	*component.Running

	csi *csiPlugin
}

// ReinitializeCSIPlugin puts the kubelet's node back into upstream's CSI
// volume plugin, after a controller-manager in this process has built its
// controllers and so initialized the plugin with no node (see csiPlugin).
func (k *Kubelet) ReinitializeCSIPlugin() error {
	if k.csi == nil {
		return nil
	}
	return k.csi.reinitialize()
}

// Start parses the flags Args(cfg) the way the kubelet command does and
// runs it; it is ready once its /healthz answers ok. It does not use the
// cobra command, which installs a process-wide signal handler and
// reconfigures logging (see apiserver.Start).
func Start(cfg Config) (*Kubelet, error) {
	// The kubelet keeps what its set-up builds, so it gets no deadline.
	ctx := context.Background()
	args := Args(cfg)
	kubeargs.Log("kubelet", args)
	flags := options.NewKubeletFlags()
	probe := pflag.NewFlagSet("kubelet", pflag.ContinueOnError)
	probe.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	defaults, err := options.NewKubeletConfiguration()
	if err != nil {
		return nil, fmt.Errorf("kubelet defaults: %w", err)
	}
	flags.AddFlags(probe)
	options.AddKubeletConfigFlags(probe, defaults)
	if err := probe.Parse(args); err != nil {
		return nil, fmt.Errorf("kubelet flags: %w (check --kubelet-arg)", err)
	}
	if err := options.ValidateKubeletFlags(flags); err != nil {
		return nil, fmt.Errorf("kubelet flags: %w (check --kubelet-arg)", err)
	}
	kc, err := loadConfigFile(ctx, flags.KubeletConfigFile)
	if err != nil {
		return nil, err
	}
	// Flags win over the file, as with the kubelet command: parse them
	// again, this time into the loaded configuration.
	final := pflag.NewFlagSet("kubelet", pflag.ContinueOnError)
	final.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	flags.AddFlags(final)
	options.AddKubeletConfigFlags(final, kc)
	if err := final.Parse(args); err != nil {
		return nil, fmt.Errorf("kubelet flags: %w (check --kubelet-arg)", err)
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(kc.FeatureGates); err != nil {
		return nil, fmt.Errorf("kubelet feature gates: %w", err)
	}
	if err := kubeletconfigvalidation.ValidateKubeletConfiguration(kc, utilfeature.DefaultFeatureGate); err != nil {
		return nil, fmt.Errorf("kubelet configuration: %w (check --kubelet-arg)", err)
	}
	if err := ensureCgroupRoot(kc); err != nil {
		return nil, err
	}
	server := &options.KubeletServer{KubeletFlags: *flags, KubeletConfiguration: *kc}
	deps, err := app.UnsecuredDependencies(ctx, server, utilfeature.DefaultFeatureGate)
	if err != nil {
		return nil, fmt.Errorf("kubelet dependencies: %w", err)
	}
	k := &Kubelet{csi: newCSIPlugin(deps.VolumePlugins)}
	if k.csi != nil {
		deps.VolumePlugins = append(deps.VolumePlugins, k.csi)
	}
	healthz := fmt.Sprintf("http://127.0.0.1:%d/healthz", HealthzPort)
	k.Running = component.Go("kubelet", func(ctx context.Context) error {
		return app.Run(ctx, server, deps, utilfeature.DefaultFeatureGate)
	}, component.ReadyWhen(component.GetOK(healthz, nil)))
	return k, nil
}

// ensureCgroupRoot makes the cgroup root of the kubelet's pods, which the
// kubelet requires to exist, with the kubelet's own cgroup manager: in
// every hierarchy with cgroupfs, as a slice of systemd's with systemd.
func ensureCgroupRoot(kc *kubeletconfiginternal.KubeletConfiguration) error {
	if !kc.CgroupsPerQOS || kc.CgroupRoot == "" || kc.CgroupRoot == "/" {
		return nil
	}
	logger := klog.Background()
	subsystems, err := cm.GetCgroupSubsystems()
	if err != nil {
		return fmt.Errorf("the kubelet's cgroup root %s: %w", kc.CgroupRoot, err)
	}
	m := cm.NewCgroupManager(logger, subsystems, kc.CgroupDriver)
	name := cm.ParseCgroupfsToCgroupName(kc.CgroupRoot)
	if m.Exists(name) {
		return nil
	}
	if err := m.Create(logger, &cm.CgroupConfig{Name: name, ResourceParameters: &cm.ResourceConfig{}}); err != nil {
		return fmt.Errorf("make the kubelet's cgroup root %s: %w", kc.CgroupRoot, err)
	}
	return nil
}

func loadConfigFile(ctx context.Context, path string) (*kubeletconfiginternal.KubeletConfiguration, error) {
	loader, err := configfiles.NewFsLoader(&utilfs.DefaultFs{}, path)
	if err != nil {
		return nil, fmt.Errorf("load kubelet config %s: %w", path, err)
	}
	kc, err := loader.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("load kubelet config %s: %w", path, err)
	}
	if kc.EvictionHard == nil {
		kc.EvictionHard = eviction.DefaultEvictionHard
	}
	return kc, nil
}
