package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/fleet"
)

// startUpgradeController carries out the Upgrades of the cluster's
// nodes. Servers that share a datastore take turns, as for HelmCharts.
func startUpgradeController(_ context.Context, g *component.Group, e *env) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this kelp's binary, beside which an Upgrade's kelp is checked: %w", err)
	}
	fc := fleet.Config{
		Kube:           e.admin.kube,
		Dynamic:        e.admin.dynamic,
		Extensions:     e.admin.extensions,
		LeaderElection: e.leaderElection(),
		DataDir:        e.cfg.DataDir,
		StageDir:       filepath.Dir(self),
	}
	if !e.cfg.DisableAgent {
		fc.Self = e.cfg.NodeName
	}
	return g.Go("upgrade controller", func(ctx context.Context) error { return fleet.Run(ctx, fc) })
}
