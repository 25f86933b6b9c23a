package nodeaddress

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	cloudprovider "k8s.io/cloud-provider"
	cloudapi "k8s.io/cloud-provider/api"
	nodecontroller "k8s.io/cloud-provider/controllers/node"
	controllersmetrics "k8s.io/component-base/metrics/prometheus/controllers"

	"github.com/kelp-dev/kelp/internal/informer"
)

// ExternalIPAnnotation holds a node's --node-external-ip values,
// comma-separated.
const ExternalIPAnnotation = "node.kelp.io/external-ip"

// statusUpdate is how often the controller brings node addresses up to
// date with the annotations.
const statusUpdate = 10 * time.Second

// Run sets the addresses of every node until ctx ends. It reads and
// writes whole Nodes: the server's cache must not trim them.
func Run(ctx context.Context, client kubernetes.Interface, informers *informer.Cache) error {
	c, err := nodecontroller.NewCloudNodeController(informers.Core().V1().Nodes(), client, provider{}, statusUpdate, 1, 1)
	if err != nil {
		return fmt.Errorf("node addresses: %w", err)
	}
	informers.Start()
	c.RunWithContext(ctx, controllersmetrics.NewControllerManagerMetrics("kelp"))
	return nil
}

// Addresses are the addresses node says it has.
func Addresses(node *corev1.Node) []corev1.NodeAddress {
	var out []corev1.NodeAddress
	add := func(typ corev1.NodeAddressType, list string) {
		for _, s := range strings.Split(list, ",") {
			if ip, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil {
				out = append(out, corev1.NodeAddress{Type: typ, Address: ip.String()})
			}
		}
	}
	add(corev1.NodeInternalIP, node.Annotations[cloudapi.AnnotationAlphaProvidedIPAddr])
	add(corev1.NodeExternalIP, node.Annotations[ExternalIPAnnotation])
	return append(out, corev1.NodeAddress{Type: corev1.NodeHostName, Address: node.Name})
}

// provider is a cloud provider without a cloud: every node exists, runs,
// and has the addresses it says it has.
type provider struct{}

var (
	_ cloudprovider.Interface   = provider{}
	_ cloudprovider.InstancesV2 = provider{}
)

func (provider) Initialize(cloudprovider.ControllerClientBuilder, <-chan struct{}) {}
func (provider) LoadBalancer() (cloudprovider.LoadBalancer, bool)                  { return nil, false }
func (provider) Instances() (cloudprovider.Instances, bool)                        { return nil, false }
func (p provider) InstancesV2() (cloudprovider.InstancesV2, bool)                  { return p, true }
func (provider) Zones() (cloudprovider.Zones, bool)                                { return nil, false }
func (provider) Clusters() (cloudprovider.Clusters, bool)                          { return nil, false }
func (provider) Routes() (cloudprovider.Routes, bool)                              { return nil, false }
func (provider) ProviderName() string                                              { return "kelp" }
func (provider) HasClusterID() bool                                                { return true }

func (provider) InstanceExists(context.Context, *corev1.Node) (bool, error)   { return true, nil }
func (provider) InstanceShutdown(context.Context, *corev1.Node) (bool, error) { return false, nil }

func (provider) InstanceMetadata(_ context.Context, node *corev1.Node) (*cloudprovider.InstanceMetadata, error) {
	return &cloudprovider.InstanceMetadata{
		ProviderID:    "kelp://" + node.Name,
		InstanceType:  "kelp",
		NodeAddresses: Addresses(node),
	}, nil
}
