package joinapi

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/kelp-dev/kelp/internal/testlog"
	"github.com/kelp-dev/kelp/internal/token"
)

// An agent that joins with the server token is let in, but the server
// logs a warning and the agent is told (and logs it) that it should have
// a token of its own: the server token also makes servers.
func TestJoinWithServerTokenWarns(t *testing.T) {
	s, _ := testJoinAPI(t)
	hook := testlog.Capture(t)
	req := JoinRequest{NodeName: "agent-1", NodeIPs: []string{"10.99.0.3"}, Password: "0123456789abcdef0123"}
	warned := func() []*logrus.Entry {
		var out []*logrus.Entry
		for _, e := range hook.AllEntries() {
			if e.Level == logrus.WarnLevel && strings.Contains(e.Message, "server token") {
				out = append(out, e)
			}
		}
		return out
	}

	if w := joinAs(s, "node:agent-secret", req); w.Code != http.StatusOK || w.Header().Get("Warning") != "" || len(warned()) != 0 {
		t.Errorf("the agent token: %d, Warning %q, %d warnings logged; want 200 and no warning", w.Code, w.Header().Get("Warning"), len(warned()))
	}
	for _, header := range []string{"node:server-secret", "server:server-secret"} {
		hook.Reset()
		w := joinAs(s, header, req)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: %d %s, want 200", header, w.Code, w.Body)
		}
		if got := w.Header().Get("Warning"); !strings.HasPrefix(got, "299 ") || !strings.Contains(got, "kelp token create") {
			t.Errorf("%s: Warning %q, want a 299 that says to use kelp token create", header, got)
		}
		if got := warned(); len(got) != 1 || got[0].Data["node"] != "agent-1" || !strings.Contains(got[0].Message, "kelp token create") {
			t.Errorf("%s: logged %v, want one warning naming the node and kelp token create", header, got)
		}
	}

	// The agent's side: it logs what the server warned of.
	front := newStubServer(t, s.cfg.Certs, readPEM(t, s.cfg.Certs.ServerCA.Cert), s.join)
	pinned := filepath.Join(t.TempDir(), "server-ca.crt")
	if err := os.WriteFile(pinned, readPEM(t, s.cfg.Certs.ServerCA.Cert), 0o600); err != nil {
		t.Fatal(err)
	}
	hook.Reset()
	c := Client{Server: front.URL, Token: token.Token{User: token.NodeUser, Secret: "server-secret"}, CAFile: pinned}
	var resp JoinResponse
	if _, err := c.Post(t.Context(), JoinPath, req, &resp); err != nil {
		t.Fatal(err)
	}
	// Server and agent log in this one process: the agent's entry is the
	// one that names the server.
	var agent []string
	for _, e := range hook.AllEntries() {
		if e.Data["server"] == front.URL && e.Level == logrus.WarnLevel {
			agent = append(agent, e.Message)
		}
	}
	if len(agent) != 1 || !strings.Contains(agent[0], "kelp token create") {
		t.Errorf("the agent logged %q, want the server's warning", agent)
	}
}
