package gateway

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/kelp-dev/kelp/internal/leader"
)

// leaseName is the Lease the servers of a cluster take turns with.
const leaseName = "kelp-gateway-controller"

// lead runs run while this server holds the Lease (leader.Run).
func lead(ctx context.Context, client kubernetes.Interface, run func(context.Context) error) error {
	return leader.Run(ctx, client, leaseName, "writes the Gateway API status", run)
}
