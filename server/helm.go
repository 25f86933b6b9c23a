package server

import (
	"context"

	"github.com/kelp-dev/kelp/internal/helmchart"
)

// runHelmController installs, upgrades and uninstalls the charts of
// HelmCharts. Servers that share a datastore take turns; on SQLite there
// is only ever one server, and a Lease would cost a write every 15 s for
// nothing.
func runHelmController(ctx context.Context, e *env) error {
	return helmchart.Run(ctx, helmchart.Config{
		Client:          e.admin.config,
		Kube:            e.admin.kube,
		Dynamic:         e.admin.dynamic,
		Kubeconfig:      e.paths.AdminKubeconfig,
		LeaderElection:  e.leaderElection(),
		AllowLocalRepos: e.cfg.HelmAllowLocalRepos,
	})
}
