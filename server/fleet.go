package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/fleet"
	"github.com/kelp-dev/kelp/internal/layout"
)

// startUpgradeController carries out the Upgrades of the cluster's
// nodes. Servers that share a datastore take turns (leaderElection), as
// for HelmCharts.
func startUpgradeController(g *component.Group, cfg config.Server, leaderElection bool) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this kelp's binary, beside which an Upgrade's kelp is checked: %w", err)
	}
	fc := fleet.Config{
		Kubeconfig:     layout.Server(cfg.DataDir).AdminKubeconfig,
		LeaderElection: leaderElection,
		DataDir:        cfg.DataDir,
		StageDir:       filepath.Dir(self),
	}
	if !cfg.DisableAgent {
		fc.Self = cfg.NodeName
	}
	return g.Go("upgrade controller", func(ctx context.Context) error { return fleet.Run(ctx, fc) })
}
