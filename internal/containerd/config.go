package containerd

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/plugins/snapshots/overlay/overlayutils"
	"github.com/pelletier/go-toml/v2"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// Config is what containerd's configuration file is rendered from.
type Config struct {
	Root          string // <data-dir>/agent/containerd
	State         string // /run/kelp/containerd
	Address       string
	RuncBinary    string // runc from the bundle
	CNIBinDir     string
	CNIConfDir    string
	RegistryDir   string // hosts.toml per registry
	RegistryAuth  map[string]RegistryAuth
	SandboxImage  string
	Snapshotter   string // overlayfs or native
	SystemdCgroup bool
	// RestrictOOMScoreAdj keeps containers' OOM scores at or above
	// containerd's own, for hosts (containers, sandboxes) that deny kelp
	// CAP_SYS_RESOURCE.
	RestrictOOMScoreAdj bool
}

// RegistryAuth holds the credentials for one registry host.
type RegistryAuth struct {
	Username      string `toml:"username,omitempty"`
	Password      string `toml:"password,omitempty"`
	Auth          string `toml:"auth,omitempty"`
	IdentityToken string `toml:"identitytoken,omitempty"`
}

// Render returns containerd's config.toml (version 3) for cfg.
func Render(cfg Config) ([]byte, error) {
	type m = map[string]any
	doc := m{
		"version": 3,
		"root":    cfg.Root,
		"state":   cfg.State,
		"grpc":    m{"address": cfg.Address},
		"plugins": m{
			"io.containerd.cri.v1.images": m{
				"snapshotter":   cfg.Snapshotter,
				"pinned_images": m{"sandbox": cfg.SandboxImage},
				"registry":      registry(cfg),
			},
			"io.containerd.cri.v1.runtime": m{
				"restrict_oom_score_adj": cfg.RestrictOOMScoreAdj,
				"cni":                    m{"bin_dirs": []string{cfg.CNIBinDir}, "conf_dir": cfg.CNIConfDir},
				"containerd": m{
					"default_runtime_name": "runc",
					"runtimes": m{"runc": m{
						"runtime_type": "io.containerd.runc.v2",
						"snapshotter":  cfg.Snapshotter,
						"options":      m{"BinaryName": cfg.RuncBinary, "SystemdCgroup": cfg.SystemdCgroup},
					}},
				},
			},
			// The streaming server of kubectl exec/attach/port-forward
			// listens on loopback only; the kubelet proxies to it.
			"io.containerd.grpc.v1.cri": m{"stream_server_address": "127.0.0.1", "stream_server_port": "10010"},
		},
	}
	out, err := toml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("render containerd config: %w", err)
	}
	return out, nil
}

// registry points containerd at the hosts directory; credentials stay in
// the CRI plugin's per-host configs, which hosts.toml has no place for.
func registry(cfg Config) map[string]any {
	r := map[string]any{"config_path": cfg.RegistryDir}
	if len(cfg.RegistryAuth) > 0 {
		configs := map[string]any{}
		for host, auth := range cfg.RegistryAuth {
			configs[host] = map[string]any{"auth": auth}
		}
		r["configs"] = configs
	}
	return r
}

// WriteConfig renders cfg to path.
func WriteConfig(path string, cfg Config) error {
	data, err := Render(cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	return nil
}

// OverlaySupported reports whether the overlay snapshotter works on the
// filesystem of root.
func OverlaySupported(root string) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	return overlayutils.Supported(root)
}
