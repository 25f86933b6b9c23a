package kubelet

import (
	"errors"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/csi"
)

// csiPlugin lets the kubelet's CSI volume plugin be initialized again.
//
// Upstream's CSI plugin keeps the node it registers drivers for, and the
// handler of driver registrations, in package variables that every
// initialization of the plugin overwrites (k8s.io/kubernetes/pkg/volume/csi,
// csi_plugin.go: nim, PluginHandler). A controller-manager in the same
// process initializes the plugin too when it builds its volume
// controllers, with no node. From then on the kubelet's CSINode cannot be
// initialized and no CSI driver can register: both name a node "". Where
// that happens after the kubelet started (a server that starts leading
// later), initializing the kubelet's plugin again puts its node back.
//
// It is itself a volume plugin that supports no volume: the kubelet
// initializes it, after every other plugin, with the host it gives them
// all, which is the one the CSI plugin needs again.
type csiPlugin struct {
	plugin volume.VolumePlugin // the kubelet's CSI plugin

	mu   sync.Mutex
	host volume.VolumeHost // nil until the kubelet has initialized its plugins
}

var _ volume.VolumePlugin = (*csiPlugin)(nil)

// newCSIPlugin finds the CSI plugin among the kubelet's plugins; nil if
// there is none.
func newCSIPlugin(plugins []volume.VolumePlugin) *csiPlugin {
	for _, p := range plugins {
		if p.GetPluginName() == csi.CSIPluginName {
			return &csiPlugin{plugin: p}
		}
	}
	return nil
}

// reinitialize initializes the kubelet's CSI plugin again, with the
// kubelet's host. Before the kubelet has initialized its plugins it does
// nothing: the kubelet's own initialization, still to come, is then the
// last one.
func (c *csiPlugin) reinitialize() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.host == nil {
		return nil
	}
	if err := c.plugin.Init(c.host); err != nil {
		return fmt.Errorf("initialize the kubelet's CSI volume plugin again: %w", err)
	}
	return nil
}

var errNoVolumes = errors.New("kelp's CSI plugin keeper supports no volume")

func (c *csiPlugin) Init(host volume.VolumeHost) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.host = host
	return nil
}

func (*csiPlugin) GetPluginName() string                                  { return "kelp.io/csi-plugin-keeper" }
func (*csiPlugin) GetVolumeName(*volume.Spec) (string, error)             { return "", errNoVolumes }
func (*csiPlugin) CanSupport(*volume.Spec) bool                           { return false }
func (*csiPlugin) RequiresRemount(*volume.Spec) bool                      { return false }
func (*csiPlugin) SupportsMountOption() bool                              { return false }
func (*csiPlugin) SupportsSELinuxContextMount(*volume.Spec) (bool, error) { return false, nil }

func (*csiPlugin) NewMounter(*volume.Spec, *v1.Pod) (volume.Mounter, error) {
	return nil, errNoVolumes
}

func (*csiPlugin) NewUnmounter(string, types.UID) (volume.Unmounter, error) {
	return nil, errNoVolumes
}

func (*csiPlugin) ConstructVolumeSpec(string, string) (volume.ReconstructedVolume, error) {
	return volume.ReconstructedVolume{}, errNoVolumes
}
