package apiserver

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	genericoptions "k8s.io/apiserver/pkg/server/options"
	"sigs.k8s.io/yaml"

	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/pki"
)

func testConfig() Config {
	return Config{
		BindAddress:          netip.MustParseAddr("0.0.0.0"),
		Port:                 6443,
		AdvertiseAddress:     netip.MustParseAddr("192.168.1.10"),
		ServiceCIDRs:         []netip.Prefix{netip.MustParsePrefix("10.43.0.0/16")},
		ServiceNodePortRange: "30000-32767",
		ClusterDomain:        "cluster.local",
		Certs:                pki.FilesIn("/tls"),
		Storage:              datastore.Backend{Endpoints: []string{"unix:///var/lib/kelp/server/db/kine.sock"}},
	}
}

func TestArgs(t *testing.T) {
	tests := []struct {
		name      string
		change    func(*Config)
		want, not []string
	}{
		{
			name: "defaults",
			want: []string{
				"--authorization-mode=Node,RBAC",
				"--enable-admission-plugins=NodeRestriction,ValidatingAdmissionPolicy",
				"--secure-port=6443",
				"--bind-address=0.0.0.0",
				"--advertise-address=192.168.1.10",
				"--service-cluster-ip-range=10.43.0.0/16",
				"--etcd-servers=unix:///var/lib/kelp/server/db/kine.sock",
				"--client-ca-file=/tls/client-ca.crt",
				"--tls-cert-file=/tls/serving-kube-apiserver.crt",
				"--tls-private-key-file=/tls/serving-kube-apiserver.key",
				"--kubelet-client-certificate=/tls/client-kube-apiserver.crt",
				"--kubelet-client-key=/tls/client-kube-apiserver.key",
				"--proxy-client-key-file=/tls/client-auth-proxy.key",
				"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
				"--service-account-signing-key-file=/tls/service.key",
				"--profiling=false",
				"--endpoint-reconciler-type=lease",
				"--enable-aggregator-routing=true",
			},
			not: []string{"--etcd-cafile=", "--etcd-certfile=", "--etcd-servers-overrides=", "--feature-gates=", "--audit-log-path=", "--admission-control-config-file=", "--encryption-provider-config="},
		},
		{
			name: "dual-stack",
			change: func(c *Config) {
				c.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.43.0.0/16"), netip.MustParsePrefix("fd43::/112")}
			},
			want: []string{"--service-cluster-ip-range=10.43.0.0/16,fd43::/112"},
		},
		{
			name: "audit and admission",
			change: func(c *Config) {
				c.Audit = Audit{LogPath: "/var/log/kelp/audit.log", PolicyFile: "/etc/audit.yaml", MaxSizeMB: 100, MaxBackups: 10, MaxAgeDays: 30}
				c.AdmissionConfigFile = "/etc/admission.yaml"
				c.EncryptionConfigFile = "/cred/encryption-config.json"
			},
			want: []string{"--audit-log-path=/var/log/kelp/audit.log", "--audit-policy-file=/etc/audit.yaml", "--audit-log-maxsize=100",
				"--audit-log-maxbackup=10", "--audit-log-maxage=30", "--admission-control-config-file=/etc/admission.yaml",
				"--encryption-provider-config=/cred/encryption-config.json", "--encryption-provider-config-automatic-reload=true"},
		},
		{
			name:   "single server",
			change: func(c *Config) { c.SingleServer = true },
			want:   []string{"--endpoint-reconciler-type=master-count", "--apiserver-count=1", "--feature-gates=UnknownVersionInteroperabilityProxy=false"},
			not:    []string{"--endpoint-reconciler-type=lease"},
		},
		{
			name: "etcd over TLS",
			change: func(c *Config) {
				c.Storage = datastore.Backend{Endpoints: []string{"https://127.0.0.1:2379", "https://10.0.0.2:2379"}, CAFile: "/ca", CertFile: "/c", KeyFile: "/k"}
			},
			want: []string{"--etcd-servers=https://127.0.0.1:2379,https://10.0.0.2:2379", "--etcd-cafile=/ca", "--etcd-certfile=/c", "--etcd-keyfile=/k"},
		},
		{
			name: "RAM store",
			change: func(c *Config) {
				c.RAMStorage = datastore.Backend{Endpoints: []string{"unix:///run/kelp/ram/0123/kine.sock"}}
			},
			want: []string{
				"--etcd-servers=unix:///var/lib/kelp/server/db/kine.sock",
				"--etcd-servers-overrides=coordination.k8s.io/leases#unix:///run/kelp/ram/0123/kine.sock,/events#unix:///run/kelp/ram/0123/kine.sock",
			},
		},
		{
			name: "RAM store with several endpoints",
			change: func(c *Config) {
				c.RAMStorage = datastore.Backend{Endpoints: []string{"unix:///a.sock", "unix:///b.sock"}}
			},
			want: []string{"--etcd-servers-overrides=coordination.k8s.io/leases#unix:///a.sock;unix:///b.sock,/events#unix:///a.sock;unix:///b.sock"},
		},
		{
			name: "user overrides win",
			change: func(c *Config) {
				c.RAMStorage = datastore.Backend{Endpoints: []string{"unix:///run/kelp/ram/0123/kine.sock"}}
				c.ExtraArgs = []string{"etcd-servers-overrides=/events#https://10.0.0.9:2379"}
			},
			want: []string{"--etcd-servers-overrides=/events#https://10.0.0.9:2379"},
			not:  []string{"--etcd-servers-overrides=coordination.k8s.io/leases#unix:///run/kelp/ram/0123/kine.sock,/events#unix:///run/kelp/ram/0123/kine.sock"},
		},
		{
			name:   "user args win",
			change: func(c *Config) { c.ExtraArgs = []string{"profiling=true", "audit-log-path=/var/log/audit.log"} },
			want:   []string{"--profiling=true", "--audit-log-path=/var/log/audit.log"},
			not:    []string{"--profiling=false"},
		},
		{
			name:   "port and domain",
			change: func(c *Config) { c.Port = 7443; c.ClusterDomain = "edge.example" },
			want:   []string{"--secure-port=7443", "--api-audiences=https://kubernetes.default.svc.edge.example"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			if tt.change != nil {
				tt.change(&cfg)
			}
			args := Args(cfg)
			for _, w := range tt.want {
				if !slices.Contains(args, w) {
					t.Errorf("missing %s in %v", w, args)
				}
			}
			for _, n := range tt.not {
				for _, a := range args {
					if a == n || (n[len(n)-1] == '=' && len(a) >= len(n) && a[:len(n)] == n) {
						t.Errorf("unexpected %s", a)
					}
				}
			}
		})
	}
}

// TestRAMStorageOverridesParse checks that the apiserver reads kelp's
// overrides as meant: Leases and Events, each at the RAM store.
func TestRAMStorageOverridesParse(t *testing.T) {
	cfg := testConfig()
	cfg.RAMStorage = datastore.Backend{Endpoints: []string{"unix:///a.sock", "unix:///b.sock"}}
	var value string
	for _, a := range Args(cfg) {
		if v, ok := strings.CutPrefix(a, "--etcd-servers-overrides="); ok {
			value = v
		}
	}
	overrides, err := genericoptions.ParseEtcdServersOverrides(strings.Split(value, ","))
	if err != nil {
		t.Fatalf("%q: %v", value, err)
	}
	var got []string
	for _, o := range overrides {
		got = append(got, o.GroupResource.String()+" at "+strings.Join(o.Servers, " "))
	}
	want := []string{"leases.coordination.k8s.io at unix:///a.sock unix:///b.sock", "events at unix:///a.sock unix:///b.sock"}
	if !slices.Equal(got, want) {
		t.Errorf("overrides %q parse as %q, want %q", value, got, want)
	}
}

func TestLocalURL(t *testing.T) {
	for bind, want := range map[string]string{
		"0.0.0.0":   "https://127.0.0.1:6443",
		"127.0.0.1": "https://127.0.0.1:6443",
		"10.0.0.5":  "https://10.0.0.5:6443",
		"::":        "https://127.0.0.1:6443",
		"fd00::5":   "https://[fd00::5]:6443",
	} {
		if got := LocalURL(netip.MustParseAddr(bind), 6443); got != want {
			t.Errorf("%s: got %s want %s", bind, got, want)
		}
	}
}

// TestAnonymousAuthentication checks that kelp's authentication file
// replaces --anonymous-auth, and that a user's own choice of either wins.
func TestAnonymousAuthentication(t *testing.T) {
	cfg := Config{AuthenticationConfigFile: "/etc/authn.yaml"}
	args := strings.Join(Args(cfg), " ")
	if !strings.Contains(args, "--authentication-config=/etc/authn.yaml") || strings.Contains(args, "--anonymous-auth") {
		t.Errorf("with kelp's file: %s", args)
	}
	for _, extra := range []string{"anonymous-auth=false", "authentication-config=/mine.yaml"} {
		cfg.ExtraArgs = []string{extra}
		args := strings.Join(Args(cfg), " ")
		if strings.Contains(args, "/etc/authn.yaml") || !strings.Contains(args, "--"+extra) {
			t.Errorf("with --kube-apiserver-arg %s: %s", extra, args)
		}
	}
	path := filepath.Join(t.TempDir(), "authn.yaml")
	if err := WriteAuthenticationConfig(path, []string{"/cacerts", "/readyz"}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Kind      string
		Anonymous struct {
			Enabled    bool
			Conditions []struct{ Path string }
		}
	}
	if err := yaml.Unmarshal(data, &parsed); err != nil {
		t.Fatal(err)
	}
	if parsed.Kind != "AuthenticationConfiguration" || !parsed.Anonymous.Enabled || len(parsed.Anonymous.Conditions) != 2 || parsed.Anonymous.Conditions[1].Path != "/readyz" {
		t.Errorf("file %+v:\n%s", parsed, data)
	}
}
