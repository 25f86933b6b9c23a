package helmchart

import (
	"context"
	"errors"
	"fmt"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// defaultTimeout bounds Helm's waits for hooks when spec.timeout does
	// not; k3s's default.
	defaultTimeout = 5 * time.Minute
	// maxHistory is how many revisions of a release Helm keeps, each a
	// Secret; the helm CLI's default.
	maxHistory = 10
)

// releases runs Helm's actions with the admin's credentials.
type releases struct {
	kubeconfig string
}

// config is a Helm configuration for releases in namespace. Each action
// gets a new one, so that it discovers the API anew: an earlier chart may
// have added CRDs.
func (r releases) config(namespace string) (*action.Configuration, error) {
	getter, err := newRESTClientGetter(r.kubeconfig, namespace)
	if err != nil {
		return nil, err
	}
	cfg := new(action.Configuration)
	if err := cfg.Init(getter, namespace, "secret", helmLog); err != nil {
		return nil, fmt.Errorf("set up Helm for namespace %s: %w", namespace, err)
	}
	return cfg, nil
}

// deploy installs ch as release name with vals, or upgrades the release to
// it, and returns what Helm recorded.
func (r releases) deploy(ctx context.Context, name string, s Spec, namespace string, ch *chart.Chart, vals map[string]any) (*release.Release, error) {
	cfg, err := r.config(namespace)
	if err != nil {
		return nil, err
	}
	timeout, err := s.timeout()
	if err != nil {
		return nil, err
	}
	last, err := cfg.Releases.Last(name)
	switch {
	case errors.Is(err, driver.ErrReleaseNotFound):
		return r.install(ctx, cfg, name, s, namespace, timeout, false, ch, vals)
	case err != nil:
		return nil, fmt.Errorf("read the history of release %s/%s: %w", namespace, name, err)
	case last.Info.Status == release.StatusUninstalled:
		return r.install(ctx, cfg, name, s, namespace, timeout, true, ch, vals)
	case last.Info.Status.IsPending():
		// Only this controller, of one server at a time, works on the
		// release: a pending operation is one that a stopped kelp left.
		// Helm refuses to start another while it looks pending.
		last.SetStatus(release.StatusFailed, "interrupted: kelp stopped during the operation")
		if err := cfg.Releases.Update(last); err != nil {
			return nil, fmt.Errorf("mark the interrupted revision %d of release %s/%s failed: %w", last.Version, namespace, name, err)
		}
	}
	up := action.NewUpgrade(cfg)
	up.Namespace = namespace
	up.Timeout = timeout
	up.MaxHistory = maxHistory
	// The spec is the whole truth: values it no longer sets go back to
	// the chart's defaults.
	up.ResetValues = true
	up.TakeOwnership = s.TakeOwnership
	rel, err := up.RunWithContext(ctx, name, ch, vals)
	if err != nil {
		return nil, fmt.Errorf("upgrade release %s/%s: %w", namespace, name, err)
	}
	return rel, nil
}

func (r releases) install(ctx context.Context, cfg *action.Configuration, name string, s Spec, namespace string, timeout time.Duration, replace bool, ch *chart.Chart, vals map[string]any) (*release.Release, error) {
	in := action.NewInstall(cfg)
	in.ReleaseName = name
	in.Namespace = namespace
	in.CreateNamespace = s.CreateNamespace
	in.Timeout = timeout
	in.Replace = replace
	in.TakeOwnership = s.TakeOwnership
	rel, err := in.RunWithContext(ctx, ch, vals)
	if err != nil {
		return nil, fmt.Errorf("install release %s/%s: %w", namespace, name, err)
	}
	return rel, nil
}

// uninstall removes release name and its objects; a release that is not
// there is no error.
func (r releases) uninstall(name, namespace string, s Spec) error {
	cfg, err := r.config(namespace)
	if err != nil {
		return err
	}
	un := action.NewUninstall(cfg)
	un.IgnoreNotFound = true
	// A timeout that does not parse must not keep a HelmChart from
	// going.
	un.Timeout, err = s.timeout()
	if err != nil {
		un.Timeout = defaultTimeout
	}
	if _, err := un.Run(name); err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
		return fmt.Errorf("uninstall release %s/%s: %w", namespace, name, err)
	}
	return nil
}

// helmLog is where Helm's own chatter goes: debug.
func helmLog(format string, args ...any) {
	log.Debugf(format, args...)
}

// restClientGetter gives Helm clients from the admin kubeconfig, with
// namespace as the default namespace. Discovery is cached in memory for
// one action (Helm's usual getter writes a cache under $HOME); Helm
// invalidates it itself after it adds CRDs.
type restClientGetter struct {
	loader    clientcmd.ClientConfig
	config    *rest.Config
	discovery discovery.CachedDiscoveryInterface
	mapper    meta.RESTMapper
}

var _ genericclioptions.RESTClientGetter = (*restClientGetter)(nil)

func newRESTClientGetter(kubeconfig, namespace string) (*restClientGetter, error) {
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
		&clientcmd.ConfigOverrides{Context: clientcmdapi.Context{Namespace: namespace}})
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", kubeconfig, err)
	}
	// A chart of a hundred objects should not queue behind client-go's
	// default of 5 requests a second.
	cfg.QPS, cfg.Burst = 50, 100
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	cached := memory.NewMemCacheClient(dc)
	return &restClientGetter{
		loader:    loader,
		config:    cfg,
		discovery: cached,
		mapper:    restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(cached), cached, nil),
	}, nil
}

func (g *restClientGetter) ToRESTConfig() (*rest.Config, error) {
	return rest.CopyConfig(g.config), nil
}

func (g *restClientGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	return g.discovery, nil
}

func (g *restClientGetter) ToRESTMapper() (meta.RESTMapper, error) { return g.mapper, nil }

func (g *restClientGetter) ToRawKubeConfigLoader() clientcmd.ClientConfig { return g.loader }
