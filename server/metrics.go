package server

import (
	"context"
	"fmt"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/metrics"
	"github.com/kelp-dev/kelp/internal/pki"
)

// startMetrics serves the metrics.k8s.io API from the kubelets' figures.
func startMetrics(ctx context.Context, g *component.Group, cfg config.Server, certs pki.Files) error {
	kubeconfig := layout.Server(cfg.DataDir).AdminKubeconfig
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("load %s: %w", kubeconfig, err)
	}
	return g.Start(metrics.Start(ctx, metrics.Config{
		Client:           rc,
		BindAddress:      cfg.BindAddress,
		AdvertiseAddress: cfg.AdvertiseAddress,
		NodeName:         cfg.NodeName,
		ClusterDomain:    cfg.ClusterDomain,
		Certs:            certs,
	}))
}
