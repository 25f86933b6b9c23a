package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

func runAgent(t *testing.T, args ...string) (Join, error) {
	t.Helper()
	t.Setenv(configFileEnv, writeFile(t, filepath.Join(t.TempDir(), "empty.yaml"), ""))
	var in AgentInput
	var got Join
	app := &cli.App{
		Name: "kelp",
		Commands: []*cli.Command{{
			Name:  "agent",
			Flags: AgentFlags(&in),
			Action: func(*cli.Context) error {
				j, err := in.Parse(testHost)
				got = j
				return err
			},
		}},
	}
	full, err := WithFileArgs(app, append([]string{"kelp", "agent"}, args...))
	if err != nil {
		return Join{}, err
	}
	return got, app.Run(full)
}

func TestAgent(t *testing.T) {
	tokenFile := writeFile(t, filepath.Join(t.TempDir(), "token"), "s3cret\n")
	j, err := runAgent(t, "--server", "https://10.99.0.2:6443/", "--token-file", tokenFile, "--node-name", "agent-1", "--node-label", "zone=a", "--kubelet-arg", "v=2", "--node-external-ip", "203.0.113.4")
	if err != nil {
		t.Fatal(err)
	}
	if j.Server != "https://10.99.0.2:6443" || j.Token != "s3cret" || j.Node.NodeName != "agent-1" || j.Node.DataDir != "/var/lib/kelp" ||
		len(j.Node.NodeIPs) != 1 || j.Node.NodeLabels[0] != "zone=a" || j.Node.KubeletArgs[0] != "v=2" ||
		len(j.Node.NodeExternalIPs) != 1 || j.Node.NodeExternalIPs[0].String() != "203.0.113.4" {
		t.Errorf("parsed %+v", j)
	}
	t.Setenv("KELP_URL", "https://server.example:6443")
	t.Setenv("KELP_TOKEN", "from-env")
	if j, err := runAgent(t); err != nil || j.Server != "https://server.example:6443" || j.Token != "from-env" {
		t.Errorf("from the environment: %+v %v", j, err)
	}
}

func TestAgentBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--token", "x"}, "--server is required"},
		{[]string{"--server", "http://10.99.0.2:6443", "--token", "x"}, "want https://<server>:6443"},
		{[]string{"--server", "10.99.0.2:6443", "--token", "x"}, "want https://<server>:6443"},
		{[]string{"--server", "https://10.99.0.2:6443"}, "a join token is required: --token, --token-file or KELP_TOKEN, from `kelp token create` on a server"},
		{[]string{"--server", "https://10.99.0.2:6443", "--token", "x", "--token-file", "/nonexistent"}, "exclude each other"},
		{[]string{"--server", "https://10.99.0.2:6443", "--token-file", "/nonexistent"}, "--token-file"},
		{[]string{"--server", "https://10.99.0.2:6443", "--token", "x", "--node-taint", "bad"}, "--node-taint"},
		{[]string{"--server", "https://10.99.0.2:6443", "--token", "x", "--node-external-ip", "example.com"}, "--node-external-ip"},
	} {
		if _, err := runAgent(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}

func TestServerJoinSettings(t *testing.T) {
	s, err := runServer(t, "--token", "s3cret-of-the-servers", "--agent-token", "s3cret-of-the-agents", "--overlay", "host-gw", "--overlay-iface", "eth1")
	if err != nil {
		t.Fatal(err)
	}
	if a := s.Agent(); s.Token != "s3cret-of-the-servers" || s.AgentToken != "s3cret-of-the-agents" || s.Overlay != "host-gw" || s.OverlayIface != "eth1" || a.Overlay != "host-gw" || a.OverlayIface != "eth1" {
		t.Errorf("parsed %+v", s)
	}
	if s, err := runServer(t); err != nil || s.Overlay != "vxlan" {
		t.Errorf("default overlay %q, %v", s.Overlay, err)
	}
	if _, err := runServer(t, "--overlay", "flannel"); err == nil || !strings.Contains(err.Error(), "want vxlan, host-gw or none") {
		t.Errorf("unknown overlay: %v", err)
	}
	if _, err := runServer(t, "--token", "KELP1abc::server:x"); err == nil || !strings.Contains(err.Error(), "the secret alone") {
		t.Errorf("a full token as --token: %v", err)
	}
}

// TestShortSecrets: a secret that a user chooses for joining nodes has at
// least 16 characters; a joining server's --token is the cluster's.
func TestShortSecrets(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "": accepted
	}{
		{[]string{"--token", "s3cret"}, "--token: a secret of 6 characters is too easy to guess: choose one of at least 16, such as the output of `openssl rand -hex 16`"},
		{[]string{"--token", "0123456789abcde"}, "--token: a secret of 15 characters"},
		{[]string{"--agent-token", "agents"}, "--agent-token: a secret of 6 characters"},
		{[]string{"--token", "0123456789abcdef", "--agent-token", "0123456789abcdef"}, ""},
		{[]string{"--server", "https://10.99.0.1:6443", "--token", "s3cret"}, ""},
		{[]string{"--server", "https://10.99.0.1:6443", "--token", "s3cret", "--agent-token", "agents"}, "--agent-token: a secret of 6 characters"},
		{nil, ""},
	} {
		_, err := runServer(t, tc.args...)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
	t.Setenv("KELP_TOKEN", "s3cret")
	if _, err := runServer(t); err == nil || !strings.Contains(err.Error(), "--token: a secret of 6 characters") {
		t.Errorf("KELP_TOKEN=s3cret: %v", err)
	}
}

// TestAgentHelpNamesAgentTokens: kelp agent --help sends agents to a
// token that joins agents only, not to the server token, which also makes
// servers.
func TestAgentHelpNamesAgentTokens(t *testing.T) {
	for _, f := range AgentFlags(&AgentInput{}) {
		if f.Names()[0] != "token" {
			continue
		}
		usage := f.(*cli.StringFlag).Usage
		if !strings.Contains(usage, "kelp token create") || strings.Contains(usage, "server/token") {
			t.Errorf("--token's help: %q, want it to name kelp token create and not the server token", usage)
		}
		return
	}
	t.Fatal("kelp agent has no --token")
}
