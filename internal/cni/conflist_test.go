package cni

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func TestConflist(t *testing.T) {
	const ipamDir = "/run/kelp/cni/networks"
	tests := []struct {
		name   string
		cidrs  []string
		routes []string
		mtu    int
	}{
		{"IPv4", []string{"10.42.3.0/24"}, []string{"0.0.0.0/0"}, 1450},
		{"IPv6", []string{"fd42:0:0:3::/64"}, []string{"::/0"}, 0},
		{"dual, IPv4 primary", []string{"10.42.3.0/24", "fd42:0:0:3::/64"}, []string{"0.0.0.0/0", "::/0"}, 1450},
		{"dual, IPv6 primary", []string{"fd42:0:0:3::/64", "10.42.3.0/24"}, []string{"::/0", "0.0.0.0/0"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cidrs []netip.Prefix
			for _, c := range tt.cidrs {
				cidrs = append(cidrs, netip.MustParsePrefix(c))
			}
			data, err := Conflist(cidrs, ipamDir, tt.mtu)
			if err != nil {
				t.Fatal(err)
			}
			var conf struct {
				CNIVersion string           `json:"cniVersion"`
				Name       string           `json:"name"`
				Plugins    []map[string]any `json:"plugins"`
			}
			if err := json.Unmarshal(data, &conf); err != nil {
				t.Fatalf("%v\n%s", err, data)
			}
			if conf.CNIVersion != "1.0.0" || conf.Name != "kelp" || len(conf.Plugins) != 2 {
				t.Fatalf("version %q name %q %d plugins", conf.CNIVersion, conf.Name, len(conf.Plugins))
			}
			bridge := conf.Plugins[0]
			for key, want := range map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "hairpinMode": true,
				// kelp masquerades with its own nftables rule.
				"ipMasq": false,
			} {
				if bridge[key] != want {
					t.Errorf("plugins[0].%s = %v, want %v", key, bridge[key], want)
				}
			}
			if mtu, set := bridge["mtu"]; (tt.mtu == 0 && set) || (tt.mtu != 0 && mtu != float64(tt.mtu)) {
				t.Errorf("plugins[0].mtu = %v, want %d (0: unset)", mtu, tt.mtu)
			}
			// One range set per family: host-local gives a pod one
			// address of each.
			var ranges, routes []any
			for _, c := range tt.cidrs {
				ranges = append(ranges, []any{map[string]any{"subnet": c}})
			}
			for _, r := range tt.routes {
				routes = append(routes, map[string]any{"dst": r})
			}
			wantIPAM := map[string]any{"type": "host-local", "dataDir": ipamDir, "ranges": ranges, "routes": routes}
			if !reflect.DeepEqual(bridge["ipam"], wantIPAM) {
				t.Errorf("ipam %#v\nwant %#v", bridge["ipam"], wantIPAM)
			}
			wantBW := map[string]any{"type": "bandwidth", "capabilities": map[string]any{"bandwidth": true}}
			if !reflect.DeepEqual(conf.Plugins[1], wantBW) {
				t.Errorf("plugins[1] %#v", conf.Plugins[1])
			}
		})
	}
	if _, err := Conflist(nil, ipamDir, 0); err == nil {
		t.Error("a node without pod CIDRs got a config")
	}
}

func TestWriteConflist(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cni")
	path := filepath.Join(dir, ConflistName)
	first := []netip.Prefix{netip.MustParsePrefix("10.42.3.0/24")}
	const ipamDir = "/run/kelp/cni/networks"

	if err := WriteConflist(dir, first, ipamDir, 0); err != nil {
		t.Fatal(err)
	}
	want, _ := Conflist(first, ipamDir, 0)
	if got, err := os.ReadFile(path); err != nil || string(got) != string(want) {
		t.Fatalf("content %q, %v", got, err)
	}

	// containerd reloads on every write; an unchanged file must stay untouched.
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	if err := WriteConflist(dir, first, ipamDir, 0); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.ModTime().Equal(old) {
		t.Errorf("identical write touched the file: mtime %v, want %v", fi.ModTime(), old)
	}

	second := []netip.Prefix{netip.MustParsePrefix("10.42.7.0/24"), netip.MustParsePrefix("fd42:0:0:7::/64")}
	if err := WriteConflist(dir, second, ipamDir, 0); err != nil {
		t.Fatal(err)
	}
	want, _ = Conflist(second, ipamDir, 0)
	if got, err := os.ReadFile(path); err != nil || string(got) != string(want) {
		t.Errorf("content not replaced: %q, %v", got, err)
	}

	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != ConflistName {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %v, want only %s", names, ConflistName)
	}
}
