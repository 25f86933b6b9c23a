package server

import (
	"context"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/metrics"
)

// startMetrics serves the metrics.k8s.io API from the kubelets' figures.
func startMetrics(ctx context.Context, g *component.Group, e *env) error {
	return g.Start(metrics.Start(ctx, metrics.Config{
		Client:           e.admin.config,
		Informers:        e.admin.informers,
		BindAddress:      e.cfg.BindAddress,
		AdvertiseAddress: e.cfg.AdvertiseAddress,
		NodeName:         e.cfg.NodeName,
		ClusterDomain:    e.cfg.ClusterDomain,
		Certs:            e.certs,
	}))
}
