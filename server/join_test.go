package server_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/testcluster"
)

// TestJoinBadInput runs `kelp agent` against a server with each mistake a
// joining node can meet, and checks it says what is wrong.
func TestJoinBadInput(t *testing.T) {
	t.Parallel()
	n := testcluster.NewNode(t)
	n.Start()
	n.WaitReady(startTimeout)
	data, err := os.ReadFile(filepath.Join(n.DataDir, "server", "token"))
	if err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(string(data))
	hash, secret, _ := strings.Cut(strings.TrimPrefix(tok, "KELP1"), "::server:")
	if len(hash) != 64 || secret == "" {
		t.Fatalf("the server's token %q is not KELP1<hash>::server:<secret>", tok)
	}
	server := "https://" + testcluster.NodeIP + ":6443"
	agent := func(timeout time.Duration, args ...string) (string, error) {
		t.Helper()
		return n.RunKelp(timeout, append([]string{"agent", "--data-dir", t.TempDir(), "--node-name", "joiner", "--node-ip", testcluster.NodeIP}, args...)...)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"wrong secret", []string{"--server", server, "--token", "KELP1" + hash + "::node:guess"}, "the token is not valid for this cluster"},
		{"short form, wrong secret", []string{"--server", server, "--token", "guess"}, "the token is not valid for this cluster"},
		{"another cluster's CA", []string{"--server", server, "--token", "KELP1" + strings.Repeat("0", 64) + "::node:" + secret}, "does not match the token's hash"},
		{"not https", []string{"--server", "http://" + testcluster.NodeIP + ":6443", "--token", tok}, "want https://<server>:6443"},
		{"no token", []string{"--server", server}, "a join token is required"},
		{"malformed token", []string{"--server", server, "--token", "KELP1abc::node:x"}, "CA hash is malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := agent(time.Minute, tc.args...)
			if testcluster.ExitCode(err) != 1 || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d, output lacks %q:\n%s", testcluster.ExitCode(err), tc.want, out)
			}
		})
	}
	t.Run("a port in use", func(t *testing.T) {
		l, err := n.Listen("tcp", ":10250")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		out, err := agent(time.Minute, "--server", server, "--token", tok)
		if testcluster.ExitCode(err) != 1 || !strings.Contains(out, "port 10250 for the kubelet is not free") {
			t.Errorf("exit %d:\n%s", testcluster.ExitCode(err), out)
		}
	})
	t.Run("server not answering", func(t *testing.T) {
		// An agent that never joined keeps trying, with backoff, and says so.
		cmd := n.Command(testcluster.Binary(t), "agent", "--data-dir", t.TempDir(), "--node-name", "joiner", "--node-ip", testcluster.NodeIP,
			"--server", "https://10.99.0.9:6443", "--token", tok)
		logPath := filepath.Join(t.TempDir(), "agent.log")
		log, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		defer log.Close()
		cmd.Stdout, cmd.Stderr = log, log
		if err := testcluster.Spawn(cmd); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
		}()
		// The retries come 1 s, 2 s, 4 s … apart, each after a dial
		// that times out: a second one shows the agent keeps trying.
		testcluster.EventuallyWithin(t, 2*time.Minute, "the agent logs at least 2 retries", func() (bool, error) {
			out, err := os.ReadFile(logPath)
			return strings.Count(string(out), "cannot join yet; trying again") >= 2, fmt.Errorf("its log: %v\n%s", err, out)
		})
	})
}
