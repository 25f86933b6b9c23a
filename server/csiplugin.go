package server

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kelp-dev/kelp/internal/controllermanager"
	"github.com/kelp-dev/kelp/internal/kubelet"
)

// builtPoll is how often a server with leader election asks its
// controller-manager whether it has built its controllers, which it does
// once it leads: a loopback GET.
const builtPoll = 5 * time.Second

// reinitializeCSIPlugin gives the kubelet's CSI volume plugin its node back
// once the controller-manager has built its controllers, which initialized
// the plugin with none (controllermanager.Built). Until then a CSI driver
// that fails to register is retried by the kubelet. It happens once: a
// controller-manager that stops leading exits the process.
func reinitializeCSIPlugin(ctx context.Context, k *kubelet.Kubelet) error {
	built := controllermanager.Built()
	if err := wait.PollUntilContextCancel(ctx, builtPoll, true, func(ctx context.Context) (bool, error) {
		return built(ctx) == nil, nil
	}); err != nil {
		return nil // stopped
	}
	if err := k.ReinitializeCSIPlugin(); err != nil {
		log.WithError(err).Warn("CSI drivers may fail to register on this node until kelp restarts")
	} else {
		log.Debug("the controller-manager built its controllers; the kubelet's CSI volume plugin has its node again")
	}
	<-ctx.Done()
	return nil
}
