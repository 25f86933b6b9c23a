package agent

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
)

// startLocalStorage provisions this node's local-path volumes.
func startLocalStorage(ctx context.Context, g *component.Group, cfg config.Agent, c kubernetes.Interface) error {
	return nil
}
