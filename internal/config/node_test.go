package config

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestNodeName(t *testing.T) {
	long := strings.Repeat("a", 254)
	tests := []struct {
		name     string
		hostname string
		args     []string
		want     string   // the node name, when parsing succeeds
		wantErr  []string // parts of the error, when it fails
	}{
		{name: "given", hostname: "host", args: []string{"--node-name", "worker-1"}, want: "worker-1"},
		{name: "given with dots", hostname: "host", args: []string{"--node-name", "pi4.lan"}, want: "pi4.lan"},
		{name: "longest", hostname: "host", args: []string{"--node-name", long[:253]}, want: long[:253]},
		{name: "given beats a bad hostname", hostname: "my_host", args: []string{"--node-name", "worker-1"}, want: "worker-1"},
		{name: "hostname", hostname: "worker-1", want: "worker-1"},
		{name: "hostname lowercased", hostname: "Pi4.LAN", want: "pi4.lan"},
		{name: "underscore", hostname: "host", args: []string{"--node-name", "a_b"},
			wantErr: []string{`--node-name "a_b" is not a valid node name`, "RFC 1123", "pass --node-name with lowercase letters, digits, '-' and '.'"}},
		{name: "given lowercased", hostname: "host", args: []string{"--node-name", "Worker-1"}, want: "worker-1"},
		{name: "too long", hostname: "host", args: []string{"--node-name", long},
			wantErr: []string{"is not a valid node name", "no more than 253 characters"}},
		{name: "hostname with underscore", hostname: "My_Host",
			wantErr: []string{`the hostname "My_Host" is not a valid node name`, "pass --node-name"}},
		{name: "no hostname", hostname: "",
			wantErr: []string{"no hostname", "pass --node-name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := runServerOn(t, Host{Hostname: tt.hostname, IP: testHost.IP}, tt.args...)
			if tt.wantErr == nil {
				if err != nil || s.NodeName != tt.want {
					t.Errorf("got %q, %v; want %q", s.NodeName, err, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("got %q, want an error", s.NodeName)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestNodeNameAgentAndFile checks that the node name is checked for an
// agent too, and when it comes from a config file.
func TestNodeNameAgentAndFile(t *testing.T) {
	if _, err := runAgent(t, "--server", "https://10.99.0.2:6443", "--token", "x", "--node-name", "a_b"); err == nil || !strings.Contains(err.Error(), "--node-name") {
		t.Errorf("agent: %v", err)
	}
	cfg := writeFile(t, filepath.Join(t.TempDir(), "config.yaml"), "node-name: a_b\n")
	if _, err := runServer(t, "--config", cfg); err == nil || !strings.Contains(err.Error(), "--node-name") {
		t.Errorf("config file: %v", err)
	}
}

// TestNodeSameForServerAndAgent checks that the node flags mean the same
// on both commands and that the server's own node gets all of them.
func TestNodeSameForServerAndAgent(t *testing.T) {
	args := []string{
		"--data-dir", "/srv/kelp/", "--debug", "--node-name", "n1", "--node-ip", "10.99.0.7",
		"--node-external-ip", "203.0.113.9", "--node-label", "zone=a", "--node-taint", "k=v:NoSchedule",
		"--private-registry", "/srv/registries.yaml", "--overlay-iface", "eth1", "--kubelet-arg", "v=2",
		"--default-local-storage-path", "/mnt/ssd", "--pod-manifests", "/etc/pods", "--protect-kernel-defaults",
		"--pprof-address", "127.0.0.1:6060",
	}
	s, err := runServer(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	j, err := runAgent(t, append([]string{"--server", "https://10.99.0.2:6443", "--token", "x"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s.Node, j.Node) {
		t.Errorf("server node %+v, agent node %+v", s.Node, j.Node)
	}
	if !reflect.DeepEqual(s.Agent().Node, s.Node) {
		t.Errorf("the server's own node %+v, want %+v", s.Agent().Node, s.Node)
	}
	if s.DataDir != "/srv/kelp" {
		t.Errorf("data dir %q, want it cleaned", s.DataDir)
	}
	// A node setting added without a flag here would go untested.
	v := reflect.ValueOf(s.Node)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Errorf("Node.%s is not set by the flags of this test: add its flag to args", v.Type().Field(i).Name)
		}
	}
}

// TestNodeDirs checks the node's directories: defaults under the data
// dir, given ones cleaned, relative ones refused.
func TestNodeDirs(t *testing.T) {
	s, err := runServer(t, "--data-dir", "/d")
	if err != nil || s.LocalStoragePath != "/d/storage" || s.PodManifests != "/d/agent/pod-manifests" {
		t.Errorf("defaults: storage %q, pod manifests %q, %v", s.LocalStoragePath, s.PodManifests, err)
	}
	s, err = runServer(t, "--default-local-storage-path", "/mnt/ssd/", "--pod-manifests", "/etc/kelp/pods")
	if err != nil || s.LocalStoragePath != "/mnt/ssd" || s.PodManifests != "/etc/kelp/pods" {
		t.Errorf("given: storage %q, pod manifests %q, %v", s.LocalStoragePath, s.PodManifests, err)
	}
	for _, flag := range []string{"--default-local-storage-path", "--pod-manifests"} {
		if _, err := runAgent(t, "--server", "https://10.99.0.2:6443", "--token", "x", flag, "storage"); err == nil || !strings.Contains(err.Error(), flag+` "storage": want an absolute path`) {
			t.Errorf("%s relative: %v", flag, err)
		}
	}
}

// TestPprofAddress checks --pprof-address: off by default, loopback only,
// localhost taken for 127.0.0.1.
func TestPprofAddress(t *testing.T) {
	s, err := runServer(t)
	if err != nil || s.PprofAddress.IsValid() {
		t.Errorf("default: %v, %v; want not served", s.PprofAddress, err)
	}
	for raw, want := range map[string]string{"127.0.0.1:6060": "127.0.0.1:6060", "localhost:6061": "127.0.0.1:6061", "[::1]:6060": "[::1]:6060"} {
		s, err := runServer(t, "--pprof-address", raw)
		if err != nil || s.PprofAddress.String() != want {
			t.Errorf("%s: got %v, %v; want %s", raw, s.PprofAddress, err, want)
		}
	}
	for raw, wantErr := range map[string]string{
		"0.0.0.0:6060":     "not a loopback address",
		"10.99.0.7:6060":   "not a loopback address",
		"6060":             "want a loopback address and port",
		"example.com:6060": "want a loopback address and port",
	} {
		_, err := runAgent(t, "--server", "https://10.99.0.2:6443", "--token", "x", "--pprof-address", raw)
		if err == nil || !strings.Contains(err.Error(), "--pprof-address") || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: got %v, want an error with %q", raw, err, wantErr)
		}
	}
}
