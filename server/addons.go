package server

import (
	"context"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
)

// startAddons applies the manifests directory: kelp's built-in manifests
// and the user's.
func startAddons(ctx context.Context, g *component.Group, cfg config.Server) error {
	return nil
}
