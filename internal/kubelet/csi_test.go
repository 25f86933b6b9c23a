package kubelet

import (
	"testing"

	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/csi"
	"k8s.io/kubernetes/pkg/volume/emptydir"
)

// initCounter is a volume plugin that counts its initializations.
type initCounter struct {
	volume.VolumePlugin // nil: only what the test calls is there
	name                string
	hosts               []volume.VolumeHost
}

func (p *initCounter) GetPluginName() string { return p.name }
func (p *initCounter) Init(host volume.VolumeHost) error {
	p.hosts = append(p.hosts, host)
	return nil
}

// host is a VolumeHost as far as the test tells one from another.
type host struct{ volume.VolumeHost }

func TestCSIPlugin(t *testing.T) {
	if newCSIPlugin(emptydir.ProbeVolumePlugins()) != nil {
		t.Error("found a CSI plugin among plugins without one")
	}
	if newCSIPlugin(csi.ProbeVolumePlugins()) == nil {
		t.Fatal("did not find upstream's CSI plugin")
	}

	upstream := &initCounter{name: csi.CSIPluginName}
	c := newCSIPlugin([]volume.VolumePlugin{&initCounter{name: "other"}, upstream})
	if err := c.reinitialize(); err != nil || len(upstream.hosts) != 0 {
		t.Fatalf("before the kubelet initialized its plugins: %v, %d initializations; want none", err, len(upstream.hosts))
	}
	kubelet := &host{}
	if err := c.Init(kubelet); err != nil {
		t.Fatal(err)
	}
	if err := c.reinitialize(); err != nil {
		t.Fatal(err)
	}
	if len(upstream.hosts) != 1 || upstream.hosts[0] != volume.VolumeHost(kubelet) {
		t.Errorf("CSI plugin initialized with %v; want once, with the kubelet's host", upstream.hosts)
	}
	if c.CanSupport(&volume.Spec{}) {
		t.Error("the keeper supports a volume")
	}
}
