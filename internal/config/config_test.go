package config

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/kelp-dev/kelp/internal/kubeargs"
)

var testHost = Host{Hostname: "Node1", IP: netip.MustParseAddr("192.168.1.10")}

// runServer parses args (without the program name and subcommand) the way
// main does on testHost and returns the result.
func runServer(t *testing.T, args ...string) (Server, error) {
	t.Helper()
	return runServerOn(t, testHost, args...)
}

// runServerOn is runServer on a machine with other facts.
func runServerOn(t *testing.T, host Host, args ...string) (Server, error) {
	t.Helper()
	// Keep the machine's /etc/kelp/config.yaml out of the tests.
	t.Setenv(configFileEnv, writeFile(t, filepath.Join(t.TempDir(), "empty.yaml"), ""))
	var in ServerInput
	var got Server
	app := &cli.App{
		Name: "kelp",
		Commands: []*cli.Command{{
			Name:  "server",
			Flags: ServerFlags(&in),
			Action: func(*cli.Context) error {
				s, err := in.Parse(host)
				got = s
				return err
			},
		}},
	}
	full, err := WithFileArgs(app, append([]string{"kelp", "server"}, args...))
	if err != nil {
		return Server{}, err
	}
	return got, app.Run(full)
}

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDefaults(t *testing.T) {
	s, err := runServer(t, "-c", filepath.Join(t.TempDir(), "none.yaml"))
	if err == nil {
		t.Fatal("an explicit config file that does not exist must be an error")
	}
	s, err = runServer(t, "--data-dir", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if s.NodeName != "node1" || s.AdvertiseAddress != testHost.IP || len(s.NodeIPs) != 1 {
		t.Errorf("host defaults: %+v", s)
	}
	if s.ClusterDNS.String() != "10.43.0.10" || s.FirstServiceIP().String() != "10.43.0.1" {
		t.Errorf("dns %s first service ip %s", s.ClusterDNS, s.FirstServiceIP())
	}
	if s.HTTPSPort != 6443 || s.WriteKubeconfigMode != 0o600 || s.WriteKubeconfig != "/etc/kelp/kelp.yaml" {
		t.Errorf("defaults: %+v", s)
	}
}

func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, filepath.Join(dir, "config.yaml"), `
cluster-domain: from.file
cluster-cidr: 10.100.0.0/16
https-listen-port: 7443
tls-san: [file-a, file-b]
kube-apiserver-arg: v=1
`)
	writeFile(t, cfg+".d/10-extra.yaml", "tls-san: [dropin]\ncluster-cidr: 10.200.0.0/16\n")
	t.Setenv("KELP_CLUSTER_DOMAIN", "from.env")
	t.Setenv("KELP_HTTPS_LISTEN_PORT", "8443")
	t.Setenv("KELP_TLS_SAN", "env-a")
	s, err := runServer(t, "-c", cfg, "--data-dir", dir, "--https-listen-port", "9443",
		"--tls-san", "flag-a", "--kube-apiserver-arg", "v=4")
	if err != nil {
		t.Fatal(err)
	}
	if s.ClusterDomain != "from.env" {
		t.Errorf("env must beat file: %q", s.ClusterDomain)
	}
	if s.HTTPSPort != 9443 {
		t.Errorf("flag must beat env and file: %d", s.HTTPSPort)
	}
	if kubeargs.CIDRs(s.ClusterCIDRs) != "10.200.0.0/16" {
		t.Errorf("a later drop-in must override a scalar: %s", s.ClusterCIDRs)
	}
	if got := strings.Join(s.TLSSANs, ","); got != "file-a,file-b,dropin,env-a,flag-a" {
		t.Errorf("lists must accumulate file, drop-in, env, flag: %s", got)
	}
	if got := strings.Join(s.ExtraArgs.APIServer, ","); got != "v=1,v=4" {
		t.Errorf("flag args must come after file args so they win: %s", got)
	}
}

// A list flag's value may name several items, from a flag, the
// environment or a file; an extra flag for a component is one value, with
// its commas.
func TestCommas(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, filepath.Join(dir, "config.yaml"), `
tls-san: ["file-a, file-b"]
kube-controller-manager-arg: ["controllers=*,-ttl-controller"]
`)
	t.Setenv("KELP_TLS_SAN", "env-a,env-b")
	t.Setenv("KELP_KUBE_SCHEDULER_ARG", "feature-gates=A=true,B=false")
	s, err := runServer(t, "-c", cfg, "--data-dir", dir, "--tls-san", "flag-a,flag-b",
		"--kube-apiserver-arg", "enable-admission-plugins=NodeRestriction,EventRateLimit", "--disable", "coredns,servicelb")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.TLSSANs, " "); got != "file-a file-b env-a env-b flag-a flag-b" {
		t.Errorf("TLS SANs %q", got)
	}
	for what, args := range map[string][]string{
		"--kube-apiserver-arg":          {"enable-admission-plugins=NodeRestriction,EventRateLimit"},
		"--kube-controller-manager-arg": {"controllers=*,-ttl-controller"},
		"KELP_KUBE_SCHEDULER_ARG":       {"feature-gates=A=true,B=false"},
	} {
		got := map[string][]string{
			"--kube-apiserver-arg":          s.ExtraArgs.APIServer,
			"--kube-controller-manager-arg": s.ExtraArgs.ControllerManager,
			"KELP_KUBE_SCHEDULER_ARG":       s.ExtraArgs.Scheduler,
		}[what]
		if !slices.Equal(got, args) {
			t.Errorf("%s: got %q, want %q", what, got, args)
		}
	}
	if !s.Disable.CoreDNS || !s.Disable.ServiceLB {
		t.Errorf("--disable coredns,servicelb: %+v", s.Disable)
	}
}

func TestConfigFileErrors(t *testing.T) {
	tests := []struct {
		name, content string
		want          []string
	}{
		{"malformed", "cluster-cidr: [10.0.0.0/8\n", []string{"bad.yaml", "not valid YAML", "line"}},
		{"unknown key", "data-dir: /x\nclustr-cidr: 10.0.0.0/8\n", []string{"bad.yaml line 2", `unknown key "clustr-cidr"`}},
		{"not a mapping", "- a\n- b\n", []string{"bad.yaml line 1", "mapping"}},
		{"bad bool", "cluster-init: maybe\n", []string{"line 1", "true or false"}},
		{"bad int", "https-listen-port: high\n", []string{"line 1", "takes a number"}},
		{"list for scalar", "cluster-cidr: [a, b]\n", []string{"line 1", "one value"}},
		{"nested", "tls-san: {a: b}\n", []string{"line 1", "not a mapping"}},
		{"repeated", "tls-san: a\ntls-san: b\n", []string{"line 2", "repeated"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, filepath.Join(t.TempDir(), "bad.yaml"), tt.content)
			_, err := runServer(t, "--config="+path)
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestValidation(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"invalid cluster cidr", []string{"--cluster-cidr", "10.42.0.0/33"}, "--cluster-cidr"},
		{"host bits", []string{"--service-cidr", "10.43.0.1/16"}, "did you mean 10.43.0.0/16"},
		{"overlap", []string{"--cluster-cidr", "10.0.0.0/8", "--service-cidr", "10.43.0.0/16"}, "overlaps"},
		{"dns outside", []string{"--cluster-dns", "10.99.0.10"}, "outside --service-cidr"},
		{"port", []string{"--https-listen-port", "70000"}, "between 1 and 65535"},
		{"mode", []string{"--write-kubeconfig-mode", "rw"}, "octal"},
		{"relative data dir", []string{"--data-dir", "var/kelp"}, "absolute"},
		{"two datastores", []string{"--cluster-init", "--datastore-endpoint", "postgres://x"}, "exclude each other"},
		{"endpoint scheme", []string{"--datastore-endpoint", "sqlite:///tmp/x"}, "postgres://"},
		{"dashed extra arg", []string{"--kube-apiserver-arg", "--v"}, "name=value"},
		{"bad node ip", []string{"--node-ip", "node1"}, "not an IP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := runServer(t, append([]string{"--data-dir", "/var/lib/kelp"}, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestDisable(t *testing.T) {
	s, err := runServer(t)
	if err != nil {
		t.Fatal(err)
	}
	if s.Disable != (Disable{}) {
		t.Errorf("by default disable = %+v, want nothing", s.Disable)
	}
	s, err = runServer(t, "--disable", "coredns", "--disable", "servicelb", "--disable-network-policy")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Disable.CoreDNS || !s.Disable.ServiceLB || !s.Disable.NetworkPolicy || !s.Agent().DisableDNS || !s.Agent().DisableNetworkPolicy {
		t.Errorf("disable = %+v", s.Disable)
	}
	if s.EmbeddedRegistry || s.Agent().EmbeddedRegistry {
		t.Error("the embedded registry mirror is on by default")
	}
	if s, err = runServer(t, "--embedded-registry"); err != nil || !s.Agent().EmbeddedRegistry {
		t.Errorf("--embedded-registry does not reach the server's node: %v", err)
	}
	s, err = runServer(t, "--disable", "gateway")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Disable.Gateway || !s.Agent().DisableGateway || s.Disable.CoreDNS {
		t.Errorf("--disable gateway: disable = %+v, agent's DisableGateway %v", s.Disable, s.Agent().DisableGateway)
	}
	if _, err := runServer(t, "--disable", "traefik"); err == nil || !strings.Contains(err.Error(), "want coredns, servicelb, local-storage, metrics-server, helm-controller or gateway") {
		t.Errorf("unknown part: %v", err)
	}
}

// A tool beside the server (kelp snapshot save) takes from the server's
// config file the keys it has flags for and leaves the others; a top-level
// command still refuses an unknown key.
func TestConfigFileNestedCommand(t *testing.T) {
	path := writeFile(t, filepath.Join(t.TempDir(), "config.yaml"), "data-dir: /srv/kelp\ncluster-init: true\nsnapshot-retention: 3\n")
	t.Setenv(configFileEnv, path)
	var dataDir string
	app := &cli.App{
		Name: "kelp",
		Commands: []*cli.Command{{
			Name: "snapshot",
			Subcommands: []*cli.Command{{
				Name:   "save",
				Flags:  []cli.Flag{ConfigFlag(), &cli.StringFlag{Name: "data-dir", Destination: &dataDir}},
				Action: func(*cli.Context) error { return nil },
			}},
		}, {
			Name:  "agent",
			Flags: []cli.Flag{ConfigFlag(), &cli.StringFlag{Name: "data-dir"}},
		}},
	}
	full, err := WithFileArgs(app, []string{"kelp", "snapshot", "save", "--name", "x"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "kelp snapshot save --data-dir=/srv/kelp --name x"; strings.Join(full, " ") != want {
		t.Errorf("args %q, want %q", strings.Join(full, " "), want)
	}
	if _, err := WithFileArgs(app, []string{"kelp", "agent"}); err == nil || !strings.Contains(err.Error(), `unknown key "cluster-init"`) {
		t.Errorf("a top-level command with an unknown key: %v", err)
	}
}

func TestAuditAndPodSecurity(t *testing.T) {
	s, err := runServer(t, "--audit-log-path", "/var/log/kelp/audit.log", "--pod-security-default", "restricted")
	if err != nil {
		t.Fatal(err)
	}
	if s.Audit != (Audit{LogPath: "/var/log/kelp/audit.log", MaxSizeMB: 100, MaxBackups: 10, MaxAgeDays: 30}) || s.PodSecurityDefault != "restricted" {
		t.Errorf("got %+v, %q", s.Audit, s.PodSecurityDefault)
	}
	if s, _ := runServer(t); s.PodSecurityDefault != "" || s.Audit.LogPath != "" {
		t.Errorf("defaults: %+v, %q", s.Audit, s.PodSecurityDefault)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pod-security-default", "strict"}, "want privileged, baseline or restricted"},
		{[]string{"--audit-policy-file", "/etc/kelp/audit.yaml"}, "give the log's path too"},
		{[]string{"--audit-log-path", "audit.log"}, "want an absolute path"},
		{[]string{"--audit-log-path", "/var/log/a.log", "--audit-policy-file", "/nonexistent/policy.yaml"}, "--audit-policy-file"},
		{[]string{"--audit-log-path", "/var/log/a.log", "--audit-log-maxsize", "0"}, "at least 1"},
	} {
		if _, err := runServer(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}
