package apiserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/errors"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/flagz"
	encryptionconfigcontroller "k8s.io/apiserver/pkg/server/options/encryptionconfig/controller"
	"k8s.io/client-go/rest"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/cli/globalflag"
	"k8s.io/component-base/logs"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	controlplaneapiserver "k8s.io/kubernetes/pkg/controlplane/apiserver"

	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/kubeargs"
	"github.com/kelp-dev/kelp/internal/pki"
	"github.com/kelp-dev/kelp/internal/secretsencrypt"
)

const identityLeaseRenewInterval = time.Minute

// Config is what the apiserver's flags are built from.
type Config struct {
	BindAddress      netip.Addr
	Port             int
	AdvertiseAddress netip.Addr
	// ServiceCIDRs are the Service ranges, the primary family first.
	ServiceCIDRs         []netip.Prefix
	ServiceNodePortRange string
	ClusterDomain        string
	Certs                pki.Files
	Storage              datastore.Backend
	// RAMStorage, when it has endpoints, holds ramResources instead of
	// Storage: the RAM store of a server on SQLite.
	RAMStorage datastore.Backend
	// SingleServer is set where no second apiserver can ever share the
	// datastore (SQLite): the apiservers' bookkeeping of each other, a
	// datastore write every 10 s each, is then left out.
	SingleServer bool
	Audit        Audit
	// AdmissionConfigFile configures the admission plugins (Pod Security's
	// default level); see WriteAdmissionConfig.
	AdmissionConfigFile string
	// EncryptionConfigFile holds the keys Secrets are encrypted with;
	// empty: stored in the clear. The apiserver reloads it when it changes.
	EncryptionConfigFile string
	// AuthenticationConfigFile limits anonymous requests to the paths
	// that need them (see WriteAuthenticationConfig); empty: anonymous
	// requests reach whatever RBAC grants system:unauthenticated.
	AuthenticationConfigFile string
	ExtraArgs                []string
	// ForeignWrites, if not nil, is told of writes by clients other than
	// kelp's own pieces (the boot guard's trial of an upgrade).
	ForeignWrites ForeignWrites
}

// Args returns the kube-apiserver command line for cfg.
func Args(cfg Config) []string {
	issuer := "https://kubernetes.default.svc." + cfg.ClusterDomain
	flags := map[string]string{
		"advertise-address":                  cfg.AdvertiseAddress.String(),
		"bind-address":                       cfg.BindAddress.String(),
		"secure-port":                        strconv.Itoa(cfg.Port),
		"allow-privileged":                   "true",
		"anonymous-auth":                     "true", // RBAC grants anonymous only /healthz, /livez, /readyz and /version
		"authorization-mode":                 "Node,RBAC",
		"enable-admission-plugins":           "NodeRestriction,ValidatingAdmissionPolicy", // the second is on by default; kelp's policies keep each node's controllers to their own node
		"client-ca-file":                     cfg.Certs.ClientCA.Cert,
		"tls-cert-file":                      cfg.Certs.APIServer.Cert,
		"tls-private-key-file":               cfg.Certs.APIServer.Key,
		"tls-min-version":                    "VersionTLS12",
		"kubelet-certificate-authority":      cfg.Certs.KubeletTrust,
		"kubelet-client-certificate":         cfg.Certs.APIServerKubeletClient.Cert,
		"kubelet-client-key":                 cfg.Certs.APIServerKubeletClient.Key,
		"kubelet-preferred-address-types":    "InternalIP,ExternalIP,Hostname",
		"proxy-client-cert-file":             cfg.Certs.AuthProxy.Cert,
		"proxy-client-key-file":              cfg.Certs.AuthProxy.Key,
		"requestheader-client-ca-file":       cfg.Certs.RequestHeaderCA.Cert,
		"requestheader-allowed-names":        "system:auth-proxy",
		"requestheader-extra-headers-prefix": "X-Remote-Extra-",
		"requestheader-group-headers":        "X-Remote-Group",
		"requestheader-username-headers":     "X-Remote-User",
		"service-account-issuer":             issuer,
		"api-audiences":                      issuer,
		"service-account-key-file":           cfg.Certs.ServiceAccountKey,
		"service-account-signing-key-file":   cfg.Certs.ServiceAccountKey,
		"service-cluster-ip-range":           kubeargs.CIDRs(cfg.ServiceCIDRs),
		"service-node-port-range":            cfg.ServiceNodePortRange,
		"storage-backend":                    "etcd3",
		"etcd-servers":                       strings.Join(cfg.Storage.Endpoints, ","),
		"profiling":                          "false",
		"endpoint-reconciler-type":           "lease",
		// Without it, shutdown waits up to --request-timeout (60 s) for
		// the watches of in-process clients; with it, 2 s after draining.
		"shutdown-send-retry-after": "true",
		// Aggregated APIs (metrics.k8s.io, served by kelp itself) are
		// reached at their Service's endpoints, not its ClusterIP: a server
		// with --disable-agent runs no Service proxy.
		"enable-aggregator-routing": "true",
	}
	if cfg.SingleServer {
		// The kubernetes Service's endpoint is this server, without the
		// lease every apiserver renews to be counted; and there is no peer
		// to proxy requests to during a mixed-version upgrade.
		flags["endpoint-reconciler-type"] = "master-count"
		flags["apiserver-count"] = "1"
		flags["feature-gates"] = "UnknownVersionInteroperabilityProxy=false"
	}
	// The apiserver refuses --anonymous-auth beside a configuration file
	// that configures anonymous access: a user's own choice of either
	// wins over kelp's file.
	if cfg.AuthenticationConfigFile != "" && !kubeargs.Sets(cfg.ExtraArgs, "anonymous-auth") && !kubeargs.Sets(cfg.ExtraArgs, "authentication-config") {
		delete(flags, "anonymous-auth")
		flags["authentication-config"] = cfg.AuthenticationConfigFile
	}
	if cfg.AdmissionConfigFile != "" {
		flags["admission-control-config-file"] = cfg.AdmissionConfigFile
	}
	if cfg.EncryptionConfigFile != "" {
		flags["encryption-provider-config"] = cfg.EncryptionConfigFile
		flags["encryption-provider-config-automatic-reload"] = "true"
	}
	if a := cfg.Audit; a.LogPath != "" {
		flags["audit-log-path"] = a.LogPath
		flags["audit-policy-file"] = a.PolicyFile
		flags["audit-log-maxsize"] = strconv.Itoa(a.MaxSizeMB)
		flags["audit-log-maxbackup"] = strconv.Itoa(a.MaxBackups)
		flags["audit-log-maxage"] = strconv.Itoa(a.MaxAgeDays)
	}
	if len(cfg.RAMStorage.Endpoints) > 0 {
		flags["etcd-servers-overrides"] = storageOverrides(ramResources, cfg.RAMStorage.Endpoints)
	}
	if cfg.Storage.CAFile != "" {
		flags["etcd-cafile"] = cfg.Storage.CAFile
	}
	if cfg.Storage.CertFile != "" {
		flags["etcd-certfile"] = cfg.Storage.CertFile
		flags["etcd-keyfile"] = cfg.Storage.KeyFile
	}
	return kubeargs.Render(flags, cfg.ExtraArgs)
}

// ramResources are what a RAM store holds, as group/resource: Leases,
// which every node renews every 10 s, nearly all that an idle cluster
// writes, and Events, which expire after an hour anyway. events.k8s.io
// Events are stored as core Events.
var ramResources = []string{"coordination.k8s.io/leases", "/events"}

// storageOverrides is --etcd-servers-overrides: each of resources stored
// at endpoints.
func storageOverrides(resources, endpoints []string) string {
	servers := strings.Join(endpoints, ";")
	overrides := make([]string, len(resources))
	for i, r := range resources {
		overrides[i] = r + "#" + servers
	}
	return strings.Join(overrides, ",")
}

// Start parses the flags Args(cfg) the way the kube-apiserver command does
// and runs the server, with routes (kelp's join API) served beside the API.
// Bad flags fail here, before anything listens. It is ready once /readyz
// answers ok at LocalURL.
//
// The upstream cobra command cannot be used as is: it installs a
// process-wide signal handler when it is built, which the other in-process
// components would install a second time (a panic). So kelp parses the same
// flag sets and calls the same Complete, Validate and Run.
func Start(cfg Config, routes map[string]http.Handler) (*component.Running, error) {
	// The apiserver's identity lease lasts an hour and is renewed every
	// 10 s, a datastore write each time; once a minute is plenty. Upstream
	// exposes the period only as this variable.
	controlplaneapiserver.IdentityLeaseRenewIntervalPeriod = identityLeaseRenewInterval
	// `kelp secrets-encrypt` waits for the apiserver to load a changed
	// encryption configuration; a minute (upstream's) per step is long.
	encryptionconfigcontroller.EncryptionConfigFileChangePollDuration = secretsencrypt.ReloadInterval
	s := options.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	named := s.Flags()
	s.Flagz = flagz.NamedFlagSetsReader{FlagSets: named}
	globalflag.AddGlobalFlags(named.FlagSet("global"), "kube-apiserver", logs.SkipLoggingConfigurationFlags())
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	args := Args(cfg)
	kubeargs.Log("kube-apiserver", args)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w (check --kube-apiserver-arg)", err)
	}
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, fmt.Errorf("kube-apiserver feature gates: %w", err)
	}
	// The apiserver's own loopback clients should not log self-issued warnings.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	// What Complete builds lives as long as the server, so it gets no
	// deadline.
	completed, err := s.Complete(context.Background())
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return nil, fmt.Errorf("kube-apiserver options: %w", errors.NewAggregate(errs))
	}
	ca, err := os.ReadFile(cfg.Certs.ServerCA.Cert)
	if err != nil {
		return nil, fmt.Errorf("read server CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	readyz := LocalURL(cfg.BindAddress, cfg.Port) + "/readyz"
	return component.Go("kube-apiserver", func(ctx context.Context) error {
		return run(ctx, completed, routes, cfg.ForeignWrites)
	},
		component.ReadyWhen(component.GetOK(readyz, &tls.Config{RootCAs: pool})),
		// It exits the whole process (klog.Fatal) when cancelled before its
		// post-start hooks are done.
		component.StopAfterReady()), nil
}

// run is upstream's app.Run with kelp's own routes added to the server,
// behind its authentication and authorization: a path ending in "/" is a
// prefix. With foreign not nil, every request passes watchWrites, at the
// heart of the aggregator's handler chain, which sees every request.
func run(ctx context.Context, opts options.CompletedOptions, routes map[string]http.Handler, foreign ForeignWrites) error {
	config, err := app.NewConfig(opts)
	if err != nil {
		return err
	}
	if foreign != nil {
		build := config.Aggregator.GenericConfig.BuildHandlerChainFunc
		config.Aggregator.GenericConfig.BuildHandlerChainFunc = func(h http.Handler, c *genericapiserver.Config) http.Handler {
			return build(watchWrites(h, foreign), c)
		}
	}
	completed, err := config.Complete()
	if err != nil {
		return err
	}
	server, err := app.CreateServerChain(completed)
	if err != nil {
		return err
	}
	mux := server.GenericAPIServer.Handler.NonGoRestfulMux
	for path, h := range routes {
		if strings.HasSuffix(path, "/") {
			mux.UnlistedHandlePrefix(path, h)
		} else {
			mux.UnlistedHandle(path, h)
		}
	}
	prepared, err := server.PrepareRun()
	if err != nil {
		return err
	}
	return prepared.Run(ctx)
}

// LocalURL is where clients on this machine reach the apiserver: loopback,
// unless it listens on one address only.
func LocalURL(bind netip.Addr, port int) string {
	host := "127.0.0.1"
	if !bind.IsUnspecified() && !bind.IsLoopback() {
		host = bind.String()
	}
	return "https://" + net.JoinHostPort(host, strconv.Itoa(port))
}
