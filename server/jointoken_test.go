package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kelp-dev/kelp/internal/config"
)

// A server offered a token that joins agents only says so before it asks
// the cluster, naming the token it needs: the full form names its user.
func TestJoinWithAgentToken(t *testing.T) {
	hash := strings.Repeat("a", 64)
	for _, tc := range []struct{ name, token, want string }{
		{"agent token", "KELP1" + hash + "::node:0123456789abcdef0123456789abcdef", "--token is an agent token, which joins agents only"},
		{"token of kelp token create", "KELP1" + hash + "::node:abcdef.0123456789abcdef", "--token is a token of `kelp token create`, which joins agents only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Nothing answers there: a join that went on would retry
			// until the context ends.
			cfg := config.Server{Node: config.Node{DataDir: t.TempDir(), NodeName: "server-2"}, JoinServer: "https://127.0.0.1:1", Token: tc.token}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := joinCluster(ctx, cfg, "")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "a server joins with the server token, from <data-dir>/server/token") {
				t.Errorf("joinCluster: %v, want %q and the token a server needs", err, tc.want)
			}
		})
	}
}
