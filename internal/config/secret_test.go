package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	logrustest "github.com/sirupsen/logrus/hooks/test"
)

// TestSecretFiles: the server's secrets come from files as the agent's
// token does; an empty file, a FIFO or both a flag and a file are errors.
func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	servers := writeFile(t, filepath.Join(dir, "token"), "s3cret-of-the-servers\n")
	agents := writeFile(t, filepath.Join(dir, "agent-token"), " s3cret-of-the-agents ")
	s, err := runServer(t, "--token-file", servers, "--agent-token-file", agents)
	if err != nil {
		t.Fatal(err)
	}
	if s.Token != "s3cret-of-the-servers" || s.AgentToken != "s3cret-of-the-agents" {
		t.Errorf("token %q, agent token %q", s.Token, s.AgentToken)
	}
	t.Setenv("KELP_AGENT_TOKEN_FILE", agents)
	if s, err := runServer(t); err != nil || s.AgentToken != "s3cret-of-the-agents" {
		t.Errorf("KELP_AGENT_TOKEN_FILE: %q, %v", s.AgentToken, err)
	}

	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	empty := writeFile(t, filepath.Join(dir, "empty"), "\n")
	short := writeFile(t, filepath.Join(dir, "short"), "s3cret")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--token-file", empty}, "--token-file " + empty + " is empty"},
		{[]string{"--agent-token-file", filepath.Join(dir, "missing")}, "--agent-token-file: open"},
		{[]string{"--token-file", fifo}, "not a regular file"},
		{[]string{"--token-file", short}, "--token: a secret of 6 characters"},
		{[]string{"--token", "s3cret-of-the-servers", "--token-file", servers}, "--token and --token-file exclude each other"},
	} {
		if _, err := runServer(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
	if _, err := runAgent(t, "--server", "https://10.99.0.2:6443", "--token-file", fifo); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("agent --token-file FIFO: %v", err)
	}
	if err := os.Remove(fifo); err != nil {
		t.Fatal(err)
	}
}

func TestSecretsOnCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string // flags warned about
	}{
		{[]string{"kelp", "agent", "--server", "https://s:6443", "--token", "K10::server:x"}, []string{"--token"}},
		{[]string{"kelp", "agent", "-t=x"}, []string{"--t"}},
		{[]string{"kelp", "agent", "--token-file", "/etc/kelp/token"}, nil},
		{[]string{"kelp", "server", "--agent-token", "x", "--snapshot-s3-secret-key=y"}, []string{"--agent-token", "--snapshot-s3-secret-key"}},
		{[]string{"kelp", "server", "--datastore-endpoint", "postgres://kelp:pw@db/kelp"}, []string{"--datastore-endpoint"}},
		{[]string{"kelp", "server", "--datastore-endpoint", "mysql://kelp:pw@tcp(db:3306)/kelp"}, []string{"--datastore-endpoint"}},
		{[]string{"kelp", "server", "--datastore-endpoint", "postgres://db/kelp?sslmode=verify-full"}, nil},
		{[]string{"kelp", "token", "rotate", "--new-token", "x"}, []string{"--new-token"}},
		{[]string{"kelp", "datastore", "migrate", "--to", "postgres://kelp:pw@db/kelp"}, []string{"--to"}},
		{[]string{"kelp", "datastore", "migrate", "--to=mysql://kelp:pw@tcp(db:3306)/kelp"}, []string{"--to"}},
		{[]string{"kelp", "datastore", "migrate", "--to", "etcd"}, nil},
		{[]string{"kelp", "kubectl", "--", "--token", "x"}, nil},
		{[]string{"kelp", "crictl", "exec", "-t", "-i", "c0ffee", "sh"}, nil},
		{[]string{"kelp", "crictl", "logs", "-t", "c0ffee"}, nil},
		{[]string{"kelp", "ctr", "run", "-t", "docker.io/library/app:1.0", "app"}, nil},
	} {
		got := SecretsOnCommandLine(tc.args)
		if len(got) != len(tc.want) {
			t.Errorf("%q: %q, want warnings about %q", tc.args, got, tc.want)
			continue
		}
		for i, w := range tc.want {
			if !strings.HasPrefix(got[i], w+" on the command line") {
				t.Errorf("%q: %q, want one about %s", tc.args, got[i], w)
			}
		}
	}
}

// TestSecretsEncryptionDefault: a new cluster encrypts Secrets unless
// told not to.
func TestSecretsEncryptionDefault(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--secrets-encryption=false"}, false},
		{[]string{"--secrets-encryption"}, true},
	} {
		s, err := runServer(t, tc.args...)
		if err != nil || s.SecretsEncryption != tc.want {
			t.Errorf("%q: SecretsEncryption %v (%v), want %v", tc.args, s.SecretsEncryption, err, tc.want)
		}
	}
	t.Setenv("KELP_SECRETS_ENCRYPTION", "false")
	if s, err := runServer(t); err != nil || s.SecretsEncryption {
		t.Errorf("KELP_SECRETS_ENCRYPTION=false: %v (%v)", s.SecretsEncryption, err)
	}
}

// TestShortSecretOfAnExistingCluster: a cluster made with a short secret
// before kelp asked for 16 characters starts, with a warning.
func TestShortSecretOfAnExistingCluster(t *testing.T) {
	dataDir := t.TempDir()
	if _, err := runServer(t, "--data-dir", dataDir, "--token", "s3cret"); err == nil {
		t.Fatal("a short secret for a new cluster was taken")
	}
	writeFile(t, filepath.Join(dataDir, "server", "token"), "K10abc::server:s3cret\n")
	hook := logrustest.NewGlobal()
	defer hook.Reset()
	if _, err := runServer(t, "--data-dir", dataDir, "--token", "s3cret"); err != nil {
		t.Fatalf("the cluster's own short secret: %v", err)
	}
	if e := hook.LastEntry(); e == nil || !strings.Contains(e.Message, "--token: a secret of 6 characters") {
		t.Errorf("no warning: %v", e)
	}
}
