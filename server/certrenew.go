package server

import (
	"context"
	"errors"
	"os"
	"slices"
	"time"

	"github.com/kelp-dev/kelp/internal/certrenew"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/kubeconfig"
	"github.com/kelp-dev/kelp/internal/pki"
)

// startCertRenewal renews the server's leaf certificates while it runs;
// its in-process clients follow them, by file (kubeconfig.WriteLocal).
// The admin kubeconfig at --write-kubeconfig keeps them embedded, so that
// it can be copied to another machine, and is written again when they are
// renewed.
func startCertRenewal(ctx context.Context, g *component.Group, e *env) error {
	pcfg := e.pki
	pcfg.LeafLifetime = e.leafLifetime
	renew := func(context.Context) error {
		renewed, err := pki.Renew(pcfg)
		if slices.Contains(renewed, e.certs.Admin) {
			admin := kubeconfig.Client{Server: e.url, CAFile: e.certs.ServerCA.Cert, Cert: e.certs.Admin}
			err = errors.Join(err, kubeconfig.Write(e.cfg.WriteKubeconfig, e.cfg.WriteKubeconfigMode, admin))
		}
		return err
	}
	// Start issued what a server needs; a test's lifetime, shorter than
	// what start issues, applies from here on.
	if err := renew(ctx); err != nil {
		return err
	}
	return g.Go("certificate renewal", certrenew.Loop{Leaves: e.certs.Leaves(), Renew: renew}.Run)
}

// testLeafLifetime is the lifetime of the leaves a test asks for
// (certrenew.TestLifetimeEnv), zero otherwise. The in-process clients
// made after it look for renewed certificates often enough for it.
func testLeafLifetime() (time.Duration, error) {
	lifetime, err := certrenew.TestLifetime(os.Getenv(certrenew.TestLifetimeEnv))
	if err != nil {
		return 0, err
	}
	certrenew.SpeedUpClientReload(pki.RenewalWindow(lifetime))
	return lifetime, nil
}
