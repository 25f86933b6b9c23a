package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"
)

// renewShare is the share of a leaf's life left when it is due for
// renewal: 120 days of a year, 79 seconds of a test's four minutes.
const renewShare = float64(renewBefore) / float64(leafValidity)

// RenewalWindow is how long before it expires a leaf that lives lifetime
// (zero: a year) is due for renewal.
func RenewalWindow(lifetime time.Duration) time.Duration {
	if lifetime <= 0 {
		lifetime = leafValidity
	}
	return time.Duration(float64(lifetime) * renewShare)
}

// renewAt is when cert enters its renewal window.
func renewAt(cert *x509.Certificate) time.Time {
	life := cert.NotAfter.Sub(cert.NotBefore)
	if life > backdate {
		// Kelp's leaves are backdated for clock skew; that hour is not
		// part of the life they were given.
		life -= backdate
	}
	return cert.NotAfter.Add(-RenewalWindow(life))
}

// Expiry is when a leaf on disk is due for renewal and when it expires.
type Expiry struct {
	Cert              string
	RenewAt, NotAfter time.Time
}

// NextExpiry returns the expiry of the leaf among leaves that is due
// first. A leaf that is missing or unreadable is due now, with a zero
// NotAfter: renewing replaces it.
func NextExpiry(leaves []Pair) Expiry {
	var first Expiry
	for i, p := range leaves {
		e := Expiry{Cert: p.Cert}
		if data, err := os.ReadFile(p.Cert); err == nil {
			if cert, err := parseCert(data); err == nil {
				e.RenewAt, e.NotAfter = renewAt(cert), cert.NotAfter
			}
		}
		if i == 0 || e.RenewAt.Before(first.RenewAt) {
			first = e
		}
	}
	return first
}

// Leaves are the server's leaf certificates, the ones Renew renews.
func (f Files) Leaves() []Pair {
	return []Pair{
		f.APIServer, f.Admin, f.ControllerManager, f.Scheduler, f.APIServerKubeletClient,
		f.KubeletClient, f.KubeletServing, f.KubeProxy, f.DNS, f.Controller, f.AuthProxy,
		f.EtcdServer, f.EtcdClient, f.EtcdPeer,
	}
}

// Leaves are a node's leaf certificates, the ones a join renews.
func (f NodeFiles) Leaves() []Pair {
	return []Pair{f.KubeletClient, f.KubeletServing, f.Proxy, f.DNS, f.Controller}
}

// Renew reissues, while the server runs, the leaves of cfg that are due
// for renewal or no longer fit cfg, and returns those it reissued. Unlike
// Ensure it makes no CA: one that went missing while the server runs is
// for the operator to restore, never for kelp to replace. A leaf it
// cannot reissue does not keep it from the others.
func Renew(cfg Config) ([]Pair, error) {
	return renew(cfg, logrus.WithField("component", "pki"))
}

func renew(cfg Config, log logrus.FieldLogger) ([]Pair, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("pki: resolve %s: %w", cfg.Dir, err)
	}
	now := time.Now
	if cfg.Now != nil {
		now = cfg.Now
	}
	is := issuer{now: now().UTC(), lifetime: cfg.LeafLifetime, log: log}
	f := FilesIn(dir)
	var cas loadedCAs
	for _, ca := range cas.slots(f) {
		a, err := loadAuthority(ca.files)
		if err != nil {
			return nil, fmt.Errorf("%w: restore it from backup", err)
		}
		*ca.dst = a
	}
	var renewed []Pair
	var errs []error
	for _, l := range cfg.leaves(f, cas) {
		reissued, err := is.ensureLeaf(l)
		if err != nil {
			errs = append(errs, err)
		}
		if reissued {
			renewed = append(renewed, l.files)
		}
	}
	return renewed, errors.Join(errs...)
}

// leafLifetime is the lifetime the server's own leaves were issued with,
// which a node that joins gets too: a year, or a test's minutes (see
// Config.LeafLifetime), which the join API has no other way to learn.
func (f Files) leafLifetime() time.Duration {
	data, err := os.ReadFile(f.KubeletClient.Cert)
	if err != nil {
		return leafValidity
	}
	cert, err := parseCert(data)
	if err != nil {
		return leafValidity
	}
	if life := cert.NotAfter.Sub(cert.NotBefore) - backdate; life > 0 && life < leafValidity {
		return life
	}
	return leafValidity
}
