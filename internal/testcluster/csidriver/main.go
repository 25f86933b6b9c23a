// Command csidriver registers a CSI driver that serves no volume with a
// kubelet, for the cluster tests:
//
//	csidriver NAME KUBELETDIR NODEID
//
// It does what a driver's node-driver-registrar does: a registration
// socket in the kubelet's plugin registry sends the kubelet to the
// driver's own socket, where NodeGetInfo answers NODEID, all that a
// registration asks of a driver. It runs until it is killed.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: csidriver NAME KUBELETDIR NODEID")
		os.Exit(2)
	}
	name, kubeletDir, nodeID := os.Args[1], os.Args[2], os.Args[3]
	dir := filepath.Join(kubeletDir, "plugins", name)
	exitOn(os.MkdirAll(dir, 0o755))
	endpoint := filepath.Join(dir, "csi.sock")
	node := grpc.NewServer()
	csi.RegisterNodeServer(node, &csiNode{nodeID: nodeID})
	go serveGRPC(node, endpoint)

	registrar := grpc.NewServer()
	registerapi.RegisterRegistrationServer(registrar, &csiRegistrar{name: name, endpoint: endpoint})
	serveGRPC(registrar, filepath.Join(kubeletDir, "plugins_registry", name+"-reg.sock"))
}

func exitOn(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func serveGRPC(s *grpc.Server, socket string) {
	_ = os.Remove(socket)
	l, err := net.Listen("unix", socket)
	exitOn(err)
	fmt.Println("serving gRPC on", socket)
	exitOn(s.Serve(l))
}

type csiRegistrar struct {
	registerapi.UnimplementedRegistrationServer
	name, endpoint string
}

func (r *csiRegistrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: r.name, Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *csiRegistrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	fmt.Printf("registered: %v %s\n", s.PluginRegistered, s.Error)
	return &registerapi.RegistrationStatusResponse{}, nil
}

type csiNode struct {
	csi.UnimplementedNodeServer
	nodeID string
}

func (n *csiNode) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: n.nodeID}, nil
}
