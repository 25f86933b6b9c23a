package controllermanager

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/netip"

	"github.com/spf13/pflag"
	restclient "k8s.io/client-go/rest"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/cli/globalflag"
	"k8s.io/component-base/logs"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	"k8s.io/kubernetes/cmd/kube-controller-manager/names"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/kubeargs"
	"github.com/kelp-dev/kelp/internal/pki"
)

// securePort is where the controller-manager serves /healthz, on loopback.
const securePort = "10257"

// Config is what the controller-manager's flags are built from.
type Config struct {
	Kubeconfig string
	// ClusterCIDRs and ServiceCIDRs are the pod and Service ranges, the
	// primary family first; a node gets a pod range of each.
	ClusterCIDRs []netip.Prefix
	ServiceCIDRs []netip.Prefix
	Certs        pki.Files
	// LeaderElection is off where no second server can share the
	// datastore (SQLite).
	LeaderElection bool
	ExtraArgs      []string
}

// Args returns the kube-controller-manager command line for cfg.
func Args(cfg Config) []string {
	flags := kubeargs.WithLeaderElection(map[string]string{
		"kubeconfig":                       cfg.Kubeconfig,
		"authentication-kubeconfig":        cfg.Kubeconfig,
		"authorization-kubeconfig":         cfg.Kubeconfig,
		"bind-address":                     "127.0.0.1",
		"secure-port":                      securePort,
		"allocate-node-cidrs":              "true",
		"cluster-cidr":                     kubeargs.CIDRs(cfg.ClusterCIDRs),
		"service-cluster-ip-range":         kubeargs.CIDRs(cfg.ServiceCIDRs),
		"configure-cloud-routes":           "false",
		"controllers":                      "*,tokencleaner",
		"root-ca-file":                     cfg.Certs.ServerCA.Cert,
		"service-account-private-key-file": cfg.Certs.ServiceAccountKey,
		"use-service-account-credentials":  "true",
		"profiling":                        "false",
		// The secure port serves kelp's /healthz probe (anonymous) on
		// loopback, and metrics the apiserver's /metrics serves too (one
		// process, one registry); bearer tokens still authenticate there.
		// Looking up the client CAs in
		// kube-system/extension-apiserver-authentication costs two
		// single-ConfigMap informers with their watches (issue 37).
		"authentication-skip-lookup": "true",
		// Kubelet client and apiserver client certificates are signed by
		// the client CA the apiserver trusts; kubelet serving certificates
		// by the kubelet CA the apiserver verifies kubelets with, never by
		// the server CA its clients trust (package pki); others by the
		// server CA.
		"cluster-signing-kube-apiserver-client-cert-file": cfg.Certs.ClientCASigner,
		"cluster-signing-kube-apiserver-client-key-file":  cfg.Certs.ClientCA.Key,
		"cluster-signing-kubelet-client-cert-file":        cfg.Certs.ClientCASigner,
		"cluster-signing-kubelet-client-key-file":         cfg.Certs.ClientCA.Key,
		"cluster-signing-kubelet-serving-cert-file":       cfg.Certs.KubeletCASigner,
		"cluster-signing-kubelet-serving-key-file":        cfg.Certs.KubeletCA.Key,
		"cluster-signing-legacy-unknown-cert-file":        cfg.Certs.ServerCASigner,
		"cluster-signing-legacy-unknown-key-file":         cfg.Certs.ServerCA.Key,
		// Without it the controller-manager exits the whole process when
		// its context ends; with it, it releases its lease and returns,
		// so a restarted server takes the lease over at once.
		"feature-gates": "ControllerManagerReleaseLeaderElectionLockOnExit=true",
	}, cfg.LeaderElection)
	return kubeargs.Render(flags, cfg.ExtraArgs)
}

// Start parses the flags Args(cfg) the way the kube-controller-manager
// command does and runs it (see apiserver.Start for why not the cobra
// command). When it is ready, see Built.
func Start(cfg Config) (*component.Running, error) {
	s, err := options.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager options: %w", err)
	}
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	named := s.Flags(app.KnownControllers(), app.ControllersDisabledByDefault(), app.ControllerAliases())
	s.ParsedFlags = &named
	globalflag.AddGlobalFlags(named.FlagSet("global"), "kube-controller-manager", logs.SkipLoggingConfigurationFlags())
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	args := Args(cfg)
	kubeargs.Log("kube-controller-manager", args)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-controller-manager flags: %w (check --kube-controller-manager-arg)", err)
	}
	if err := s.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, fmt.Errorf("kube-controller-manager feature gates: %w", err)
	}
	restclient.SetDefaultWarningHandler(restclient.NoWarnings{})
	// What Config builds lives as long as the controller-manager, so it
	// gets no deadline.
	c, err := s.Config(context.Background(), app.KnownControllers(), app.ControllersDisabledByDefault(), app.ControllerAliases())
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager config: %w", err)
	}
	ready := Built()
	if cfg.LeaderElection {
		ready = component.GetOK(healthz, insecure())
	}
	return component.Go("kube-controller-manager", func(ctx context.Context) error {
		return app.Run(ctx, c.Complete())
	}, component.ReadyWhen(ready)), nil
}

// healthz is the controller-manager's verbose health check.
const healthz = "https://127.0.0.1:" + securePort + "/healthz?verbose"

// insecure is how healthz is probed: the serving certificate is
// self-signed in memory and only loopback is probed, so it is not
// verified.
func insecure() *tls.Config { return &tls.Config{InsecureSkipVerify: true} }

// Built is a probe that succeeds once the controller-manager has built its
// controllers: its verbose /healthz lists the check of the one it builds
// first, as it registers every controller's check at once, after building
// them all. Building them initializes their volume plugins, upstream's CSI
// plugin among them, which keeps the node it serves in a package variable
// that every initialization overwrites; the controllers' have no node
// (k8s.io/kubernetes/pkg/volume/csi, csi_plugin.go). A kubelet in the same
// process initializes its plugin after that, or again (package kubelet),
// or its CSINode fails to initialize and CSI drivers fail to register.
//
// Without leader election the controllers are built at start, and the
// controller-manager is ready only once they are, so that the kubelet,
// which kelp starts after, initializes the plugin last. With leader
// election they are built whenever this server starts leading, which
// nothing can wait for: it is ready on any answer.
func Built() func(context.Context) error {
	return component.GetOKWith(healthz, insecure(), "[+]"+names.ServiceAccountTokenController+" ok")
}
