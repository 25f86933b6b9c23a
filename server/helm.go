package server

import (
	"context"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/helmchart"
	"github.com/kelp-dev/kelp/internal/layout"
)

// startHelmController installs, upgrades and uninstalls the charts of
// HelmChart objects. Servers that share a datastore take turns
// (leaderElection); on SQLite there is only ever one server, and a Lease
// would cost a write every 15 s for nothing.
func startHelmController(g *component.Group, cfg config.Server, leaderElection bool) error {
	hc := helmchart.Config{
		Kubeconfig:      layout.Server(cfg.DataDir).AdminKubeconfig,
		LeaderElection:  leaderElection,
		AllowLocalRepos: cfg.HelmAllowLocalRepos,
	}
	return g.Go("helm-controller", func(ctx context.Context) error { return helmchart.Run(ctx, hc) })
}
