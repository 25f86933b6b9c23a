package kubelet

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/kubernetes/pkg/kubelet/cm"

	"github.com/kelp-dev/kelp/internal/nodepaths"
	"github.com/kelp-dev/kelp/internal/pki"
)

func baseConfig() Config {
	return Config{
		NodeName:        "node1",
		Kubeconfig:      "/k/kubelet.kubeconfig",
		ConfigFile:      "/k/kubelet.yaml",
		RuntimeEndpoint: "unix:///run/kelp/containerd/containerd.sock",
		ClientCA:        "/k/client-ca.crt",
		Serving:         pki.Pair{Cert: "/k/serving.crt", Key: "/k/serving.key"},
		ClusterDNS:      netip.MustParseAddr("10.43.0.10"),
		ClusterDomain:   "cluster.local",
		ResolvConf:      "/etc/resolv.conf",
		StaticPodDir:    "/k/manifests",
	}
}

func TestArgs(t *testing.T) {
	base := []string{"--cloud-provider=external", "--config=/k/kubelet.yaml", "--hostname-override=node1", "--kubeconfig=/k/kubelet.kubeconfig"}
	tests := []struct {
		name   string
		modify func(*Config)
		want   []string
	}{
		{"minimal", func(*Config) {}, base},
		{
			"dual-stack node IPs, labels and taints",
			func(c *Config) {
				c.NodeIPs = []netip.Addr{netip.MustParseAddr("192.168.1.5"), netip.MustParseAddr("fd00::5")}
				c.Labels = []string{"a=1", "b=2"}
				c.Taints = []string{"k=v:NoSchedule", "x=y:NoExecute"}
			},
			[]string{"--cloud-provider=external", "--config=/k/kubelet.yaml", "--hostname-override=node1", "--kubeconfig=/k/kubelet.kubeconfig",
				"--node-ip=192.168.1.5,fd00::5", "--node-labels=a=1,b=2", "--register-with-taints=k=v:NoSchedule,x=y:NoExecute"},
		},
		{
			// Empty slices must not produce an empty flag, which would
			// override the kubelet's defaults with "".
			"empty slices are absent",
			func(c *Config) { c.NodeIPs, c.Labels, c.Taints = []netip.Addr{}, []string{}, []string{} },
			base,
		},
		{
			"extra args add and override",
			func(c *Config) { c.ExtraArgs = []string{"max-pods=50", "hostname-override=x"} },
			[]string{"--cloud-provider=external", "--config=/k/kubelet.yaml", "--hostname-override=x", "--kubeconfig=/k/kubelet.kubeconfig", "--max-pods=50"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := baseConfig()
			tt.modify(&cfg)
			if got := Args(cfg); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestConfiguration(t *testing.T) {
	tests := []struct {
		name             string
		systemd, v1      bool
		wantDriver       string
		wantFailCgroupV1 bool
	}{
		{"cgroupfs on v2", false, false, "cgroupfs", true},
		{"systemd on v2", true, false, "systemd", true},
		// A v1 host is accepted only when kelp has detected it and opted in.
		{"cgroupfs on v1", false, true, "cgroupfs", false},
		{"systemd on v1", true, true, "systemd", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.SystemdCgroups, cfg.CgroupV1 = tt.systemd, tt.v1
			kc := Configuration(cfg)

			if kc.CgroupDriver != tt.wantDriver {
				t.Errorf("cgroupDriver %q, want %q", kc.CgroupDriver, tt.wantDriver)
			}
			if kc.FailCgroupV1 == nil || *kc.FailCgroupV1 != tt.wantFailCgroupV1 {
				t.Errorf("failCgroupV1 %v, want %v", kc.FailCgroupV1, tt.wantFailCgroupV1)
			}
			if kc.Kind != "KubeletConfiguration" || kc.APIVersion != "kubelet.config.k8s.io/v1beta1" {
				t.Errorf("type meta %+v", kc.TypeMeta)
			}
			if kc.FailSwapOn == nil || *kc.FailSwapOn {
				t.Errorf("failSwapOn %v, want false", kc.FailSwapOn)
			}
			if kc.MemorySwap.SwapBehavior != "NoSwap" {
				t.Errorf("swapBehavior %q", kc.MemorySwap.SwapBehavior)
			}
			if a := kc.Authentication; a.Anonymous.Enabled == nil || *a.Anonymous.Enabled ||
				a.Webhook.Enabled == nil || !*a.Webhook.Enabled || a.X509.ClientCAFile != "/k/client-ca.crt" {
				t.Errorf("authentication %+v", a)
			}
			if kc.Authorization.Mode != "Webhook" {
				t.Errorf("authorization mode %q", kc.Authorization.Mode)
			}
			if !reflect.DeepEqual(kc.ClusterDNS, []string{"10.43.0.10"}) || kc.ClusterDomain != "cluster.local" {
				t.Errorf("clusterDNS %v domain %q", kc.ClusterDNS, kc.ClusterDomain)
			}
			// 0 disables the unauthenticated read-only port.
			if kc.ReadOnlyPort != 0 {
				t.Errorf("readOnlyPort %d", kc.ReadOnlyPort)
			}
			if kc.TLSCertFile != "/k/serving.crt" || kc.TLSPrivateKeyFile != "/k/serving.key" {
				t.Errorf("tls %q %q", kc.TLSCertFile, kc.TLSPrivateKeyFile)
			}
			if kc.ContainerRuntimeEndpoint != cfg.RuntimeEndpoint || kc.StaticPodPath != "/k/manifests" ||
				kc.ResolverConfig == nil || *kc.ResolverConfig != "/etc/resolv.conf" {
				t.Errorf("endpoint %q static %q resolv %v", kc.ContainerRuntimeEndpoint, kc.StaticPodPath, kc.ResolverConfig)
			}
			if kc.HealthzBindAddress != "127.0.0.1" || kc.HealthzPort == nil || *kc.HealthzPort != HealthzPort {
				t.Errorf("healthz %s:%v", kc.HealthzBindAddress, kc.HealthzPort)
			}
		})
	}
}

func TestWriteConfigFile(t *testing.T) {
	cfg := baseConfig()
	// The parent does not exist yet: WriteConfigFile creates it.
	cfg.ConfigFile = filepath.Join(t.TempDir(), "agent", "kubelet.yaml")
	if err := WriteConfigFile(cfg); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(cfg.ConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: KubeletConfiguration", "apiVersion: kubelet.config.k8s.io/v1beta1", "cgroupDriver: cgroupfs"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("missing %q in\n%s", want, data)
		}
	}
}

func TestProtectKernelDefaults(t *testing.T) {
	cfg := baseConfig()
	if Configuration(cfg).ProtectKernelDefaults {
		t.Error("protectKernelDefaults on by default: the kubelet would fail on hosts it can fix")
	}
	cfg.ProtectKernelDefaults = true
	if !Configuration(cfg).ProtectKernelDefaults {
		t.Error("--protect-kernel-defaults does not reach the kubelet")
	}
}

// TestNodePaths: the node's cgroup root and pod log dir reach the
// kubelet's configuration.
func TestNodePaths(t *testing.T) {
	cfg := baseConfig()
	cfg.CgroupRoot, cfg.PodLogsDir = "/kelp_0123456789ab", "/srv/kelp/agent/pod-logs"
	kc := Configuration(cfg)
	if kc.CgroupRoot != cfg.CgroupRoot || kc.PodLogsDir != cfg.PodLogsDir {
		t.Errorf("cgroupRoot %q podLogsDir %q, want %q %q", kc.CgroupRoot, kc.PodLogsDir, cfg.CgroupRoot, cfg.PodLogsDir)
	}
}

// TestPodCgroupsOfRoot: the kubelet puts its pods where kelp killall
// looks for them, with either cgroup driver.
func TestPodCgroupsOfRoot(t *testing.T) {
	for _, root := range []string{"/", nodepaths.Derive("/srv/kelp").CgroupRoot} {
		kubepods := cm.NewCgroupName(cm.ParseCgroupfsToCgroupName(root), "kubepods")
		dirs := nodepaths.PodCgroups(root)
		if fs := strings.TrimPrefix(kubepods.ToCgroupfs(), "/"); fs != dirs[0] && !strings.HasPrefix(fs, dirs[0]+"/") {
			t.Errorf("root %s: cgroupfs kubepods %s is not in %s", root, fs, dirs[0])
		}
		if sd := strings.TrimPrefix(kubepods.ToSystemd(), "/"); sd != dirs[1] && !strings.HasPrefix(sd, dirs[1]+"/") {
			t.Errorf("root %s: systemd kubepods %s is not in %s", root, sd, dirs[1])
		}
	}
}
