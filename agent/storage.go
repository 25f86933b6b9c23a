package agent

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/informer"
	"github.com/kelp-dev/kelp/internal/localstorage"
)

// startLocalStorage provisions this node's local-path volumes. It runs on
// every node: a node does not know whether the server disabled local
// storage, and the provisioner waits quietly until the cluster grants it
// access, which only the local-path manifest does.
func startLocalStorage(g *component.Group, cfg config.Agent, c kubernetes.Interface, informers *informer.Cache) error {
	return g.Go("local storage", func(ctx context.Context) error {
		return localstorage.Run(ctx, c, informers, localstorage.Config{NodeName: cfg.NodeName, Path: cfg.LocalStoragePath})
	})
}
