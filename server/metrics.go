package server

import (
	"context"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/pki"
)

// startMetrics serves the metrics.k8s.io API from the kubelets' figures.
func startMetrics(ctx context.Context, g *component.Group, cfg config.Server, certs pki.Files) error {
	return nil
}
