package server

import (
	"fmt"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kelp-dev/kelp/embed"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/datastore"
	"github.com/kelp-dev/kelp/internal/informer"
	"github.com/kelp-dev/kelp/internal/kubeconfig"
	"github.com/kelp-dev/kelp/internal/layout"
	"github.com/kelp-dev/kelp/internal/pki"
)

// env is what the server's parts share, each fact computed once per
// start: start fills it in the order it learns them (the paths first,
// the certificates and the admin's clients before the apiserver, the
// datastore once it runs), and the parts after the apiserver only read
// it.
type env struct {
	cfg   config.Server
	paths layout.ServerPaths
	// url is the local apiserver's.
	url string
	// local is the kind of datastore the data dir held when this start
	// began (datastore.LocalKind), probed once: what the steps before the
	// datastore runs go by.
	local  string
	staged embed.Staged
	// pki is what the certificates are made of; certs are the files.
	pki   pki.Config
	certs pki.Files
	// leafLifetime is a test's short lifetime of leaf certificates; zero
	// otherwise.
	leafLifetime time.Duration
	// admin is every server-side controller's client.
	admin clients
	// reencrypt says the Secrets stored in the clear are to be rewritten
	// once the apiserver runs (secretsEncryption).
	reencrypt bool
	store     *datastore.Datastore
}

// single says this is the cluster's only server, ever: its datastore is
// SQLite, which nothing else can use. It has no leader elections and no
// bookkeeping of other apiservers.
func (e *env) single() bool {
	return e.store.Backend().Kind == datastore.KindSQLite
}

// leaderElection says the server's controllers take turns with those of
// the other servers that share its datastore.
func (e *env) leaderElection() bool {
	return !e.single()
}

// clients are the admin's, made once per process over one connection
// pool and shared by the server's controllers, as is their informer
// cache: the server's controllers list and watch each kind of object
// once.
type clients struct {
	config     *rest.Config
	kube       kubernetes.Interface
	dynamic    dynamic.Interface
	extensions apiextensionsclient.Interface
	// informers run from the first of the server's parts until the
	// server stops (the parts "informer cache" and "informers"); they
	// hold whole objects but for what informer.Trim drops, since the node
	// addresses controller writes back the Nodes it reads.
	informers *informer.Cache
}

// adminClients makes the admin's clients. It reads the certificates but
// talks to nobody, so it works before the apiserver runs; the clients
// follow the certificates when they are renewed.
func adminClients(url string, certs pki.Files) (clients, error) {
	rc, err := kubeconfig.Client{Server: url, CAFile: certs.ServerCA.Cert, Cert: certs.Admin}.RESTConfig()
	if err != nil {
		return clients{}, fmt.Errorf("the admin's client: %w", err)
	}
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return clients{}, fmt.Errorf("the admin's client: %w", err)
	}
	c := clients{config: rc}
	if c.kube, err = kubernetes.NewForConfigAndClient(rc, hc); err != nil {
		return clients{}, fmt.Errorf("the admin's client: %w", err)
	}
	if c.dynamic, err = dynamic.NewForConfigAndClient(rc, hc); err != nil {
		return clients{}, fmt.Errorf("the admin's client: %w", err)
	}
	if c.extensions, err = apiextensionsclient.NewForConfigAndClient(rc, hc); err != nil {
		return clients{}, fmt.Errorf("the admin's client: %w", err)
	}
	c.informers = informer.New(c.kube, informer.Trim)
	return c, nil
}
