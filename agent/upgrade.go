package agent

import (
	"fmt"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/fleet"
	"github.com/kelp-dev/kelp/internal/layout"
)

// startUpgrades runs the node's side of fleet upgrades under the node's
// controllers' identity: it reports on the Node which kelp runs and what
// became of the last upgrade, and upgrades the kelp at binary when the
// Node asks. An upgrade ends the node with a *fleet.RestartError, on
// which main starts the new kelp.
func startUpgrades(g *component.Group, cfg config.Agent, p layout.AgentPaths, binary string, client kubernetes.Interface) error {
	rc, err := clientcmd.BuildConfigFromFlags("", p.ControllerKubeconfig)
	if err != nil {
		return fmt.Errorf("load %s: %w", p.ControllerKubeconfig, err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	e := fleet.Executor{NodeName: cfg.NodeName, DataDir: cfg.DataDir, Binary: binary, Client: client, Dynamic: dyn, NoRollback: cfg.UpgradeAttempts == 0}
	return g.Go("upgrades", e.Run)
}
