package server

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/nodeaddress"
	"github.com/kelp-dev/kelp/internal/servicelb"
)

// startNodeAddresses runs the node address controller with the admin
// credentials.
func startNodeAddresses(adminKubeconfig string) (*component.Running, error) {
	c, err := adminClient(adminKubeconfig)
	if err != nil {
		return nil, err
	}
	return component.Go("node addresses", func(ctx context.Context) error { return nodeaddress.Run(ctx, c) }), nil
}

// startServiceLB runs the built-in load balancer controller with the
// admin credentials.
func startServiceLB(adminKubeconfig string) (*component.Running, error) {
	c, err := adminClient(adminKubeconfig)
	if err != nil {
		return nil, err
	}
	return component.Go("servicelb", func(ctx context.Context) error { return servicelb.Run(ctx, c) }), nil
}

func adminClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", kubeconfig, err)
	}
	return kubernetes.NewForConfig(rc)
}
