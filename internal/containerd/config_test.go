package containerd

import (
	"reflect"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"

	"github.com/kelp-dev/kelp/internal/layout"
)

func testConfig() Config {
	return Config{
		Root:          "/var/lib/kelp/agent/containerd",
		State:         "/run/kelp/containerd",
		Address:       layout.ContainerdAddress,
		RuncBinary:    "/bundle/bin/runc",
		CNIBinDir:     "/bundle/bin/cni",
		CNIConfDir:    "/etc/kelp/cni",
		RegistryDir:   "/etc/kelp/registries.d",
		SandboxImage:  "registry.k8s.io/pause:3.10",
		Snapshotter:   "overlayfs",
		SystemdCgroup: true,
	}
}

// lookup walks nested TOML tables; ok is false if any key is missing.
func lookup(doc map[string]any, keys ...string) (any, bool) {
	var cur any = doc
	for _, k := range keys {
		t, isTable := cur.(map[string]any)
		if !isTable {
			return nil, false
		}
		if cur, isTable = t[k]; !isTable {
			return nil, false
		}
	}
	return cur, true
}

func TestRender(t *testing.T) {
	const images, runtime = "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime"
	runc := []string{"plugins", runtime, "containerd", "runtimes", "runc"}
	tests := []struct {
		name   string
		modify func(*Config)
		want   map[string]any // path joined by "|" → value
		absent [][]string
	}{
		{
			name:   "defaults",
			modify: func(*Config) {},
			want: map[string]any{
				"version":                            int64(3),
				"root":                               "/var/lib/kelp/agent/containerd",
				"state":                              "/run/kelp/containerd",
				"grpc|address":                       layout.ContainerdAddress,
				"plugins|" + images + "|snapshotter": "overlayfs",
				"plugins|" + images + "|pinned_images|sandbox":            "registry.k8s.io/pause:3.10",
				"plugins|" + images + "|registry|config_path":             "/etc/kelp/registries.d",
				"plugins|" + runtime + "|restrict_oom_score_adj":          false,
				"plugins|" + runtime + "|cni|bin_dirs":                    []any{"/bundle/bin/cni"},
				"plugins|" + runtime + "|cni|conf_dir":                    "/etc/kelp/cni",
				"plugins|" + runtime + "|containerd|default_runtime_name": "runc",
				"plugins|io.containerd.grpc.v1.cri|stream_server_address": "127.0.0.1",
			},
			// Without credentials there is no configs table at all.
			absent: [][]string{{"plugins", images, "registry", "configs"}},
		},
		{
			name: "auth, cgroupfs, native, restricted OOM",
			modify: func(c *Config) {
				c.RegistryAuth = map[string]RegistryAuth{"registry.example.com:5000": {Username: "u", Password: "p"}}
				c.SystemdCgroup = false
				c.Snapshotter = "native"
				c.RestrictOOMScoreAdj = true
			},
			want: map[string]any{
				"plugins|" + images + "|registry|configs|registry.example.com:5000|auth|username": "u",
				"plugins|" + images + "|registry|configs|registry.example.com:5000|auth|password": "p",
				"plugins|" + images + "|snapshotter":                                              "native",
				"plugins|" + runtime + "|restrict_oom_score_adj":                                  true,
			},
			// omitempty keeps unset credential kinds out of the file.
			absent: [][]string{{"plugins", images, "registry", "configs", "registry.example.com:5000", "auth", "identitytoken"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			tt.modify(&cfg)
			out, err := Render(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var doc map[string]any
			if err := toml.Unmarshal(out, &doc); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for path, want := range tt.want {
				got, ok := lookup(doc, strings.Split(path, "|")...)
				if !ok || !reflect.DeepEqual(got, want) {
					t.Errorf("%s = %#v (present %v), want %#v", path, got, ok, want)
				}
			}
			for _, path := range tt.absent {
				if got, ok := lookup(doc, path...); ok {
					t.Errorf("%v present: %#v", path, got)
				}
			}
			opts, _ := lookup(doc, append(runc, "options")...)
			wantOpts := map[string]any{"BinaryName": "/bundle/bin/runc", "SystemdCgroup": cfg.SystemdCgroup}
			if !reflect.DeepEqual(opts, wantOpts) {
				t.Errorf("runc options %#v, want %#v", opts, wantOpts)
			}
			if s, _ := lookup(doc, append(runc, "snapshotter")...); s != cfg.Snapshotter {
				t.Errorf("runc snapshotter %v, want %s", s, cfg.Snapshotter)
			}
		})
	}
}
