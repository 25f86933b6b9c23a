package server

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"

	"github.com/kelp-dev/kelp/embed"
	"github.com/kelp-dev/kelp/internal/addons"
	"github.com/kelp-dev/kelp/internal/component"
	"github.com/kelp-dev/kelp/internal/config"
)

// startAddons applies the manifests directory: kelp's built-in manifests,
// written there first, and the user's. It returns once every manifest was
// applied once (or reported), so that the built-in objects exist when the
// server says it is ready; the directory is watched from then on.
func startAddons(ctx context.Context, g *component.Group, e *env) error {
	ca, err := os.ReadFile(e.certs.ServerCA.Cert)
	if err != nil {
		return fmt.Errorf("built-in manifests: read the server CA: %w", err)
	}
	values := addons.Values{
		ClusterDNS:    e.cfg.ClusterDNS.String(),
		ClusterDomain: e.cfg.ClusterDomain,
		ServingCA:     base64.StdEncoding.EncodeToString(ca),
	}
	if err := addons.Stage(e.paths.Manifests, embed.Manifests(), values, disabledManifests(e.cfg.Disable)); err != nil {
		return err
	}
	manifests := addons.New(addons.Clients{Kube: e.admin.kube, Dynamic: e.admin.dynamic, Extensions: e.admin.extensions}, e.paths.Manifests)
	if err := manifests.Start(ctx); err != nil {
		return err
	}
	return g.Go("manifests", manifests.Run)
}

// disabledManifests names the built-in manifests of the parts turned off
// with --disable.
func disabledManifests(d config.Disable) []string {
	var names []string
	for name, off := range map[string]bool{
		"coredns":         d.CoreDNS,
		"local-storage":   d.LocalStorage,
		"metrics-server":  d.MetricsServer,
		"helm-controller": d.HelmController,
	} {
		if off {
			names = append(names, name)
		}
	}
	return names
}
