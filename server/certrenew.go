package server

import (
	"context"
	"errors"
	"os"
	"slices"

	"github.com/kelp-dev/kelp/internal/apiserver"
	"github.com/kelp-dev/kelp/internal/certrenew"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
	"github.com/kelp-dev/kelp/internal/kubeconfig"
	"github.com/kelp-dev/kelp/internal/pki"
)

// startCertRenewal renews the server's leaf certificates while it runs;
// its in-process clients follow them, by file (kubeconfig.WriteLocal).
// The admin kubeconfig at --write-kubeconfig keeps them embedded, so that
// it can be copied to another machine, and is written again when they are
// renewed.
func startCertRenewal(ctx context.Context, g *component.Group, cfg config.Server, certs pki.Files) error {
	lifetime, err := certrenew.TestLifetime(os.Getenv(certrenew.TestLifetimeEnv))
	if err != nil {
		return err
	}
	certrenew.SpeedUpClientReload(pki.RenewalWindow(lifetime))
	url := apiserver.LocalURL(cfg.BindAddress, cfg.HTTPSPort)
	pcfg := pkiConfig(cfg)
	pcfg.LeafLifetime = lifetime
	renew := func(context.Context) error {
		renewed, err := pki.Renew(pcfg)
		if slices.Contains(renewed, certs.Admin) {
			admin := kubeconfig.Client{Server: url, CAFile: certs.ServerCA.Cert, Cert: certs.Admin}
			err = errors.Join(err, kubeconfig.Write(cfg.WriteKubeconfig, cfg.WriteKubeconfigMode, admin))
		}
		return err
	}
	// Start issued what a server needs; a test's lifetime, shorter than
	// what start issues, applies from here on.
	if err := renew(ctx); err != nil {
		return err
	}
	return g.Go("certificate renewal", certrenew.Loop{Leaves: certs.Leaves(), Renew: renew}.Run)
}
