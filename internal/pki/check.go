package pki

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kelp-dev/kelp/internal/atomicfile"
)

// Certificate states, worst last.
const (
	StatusOK      = "OK"
	StatusWarn    = "WARN"    // due: a running kelp renews a leaf within the hour, never a CA
	StatusExpired = "EXPIRED" // clients refuse it now
)

// CertStatus is one certificate on disk.
type CertStatus struct {
	Path     string
	Subject  string
	NotAfter time.Time
	DaysLeft int
	Status   string
	CA       bool
	// AlsoTrusted are the CAs a CA file trusts besides its own while a
	// CA rotation is in progress: the ones it replaces.
	AlsoTrusted []string
}

// Check reads every certificate under dir (a server's tls directory or a
// node's) and says how long each has left. kubelet-trust.crt only repeats
// CA files, which are listed themselves.
func Check(dir string, now time.Time) ([]CertStatus, error) {
	var out []CertStatus
	repeats := filepath.Base(FilesIn(dir).KubeletTrust)
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(path, ".crt") || d.Name() == repeats {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		certs, err := parseCerts(data)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		cert := certs[0]
		s := CertStatus{Path: path, Subject: cert.Subject.CommonName, NotAfter: cert.NotAfter, CA: cert.IsCA, Status: StatusOK}
		for _, c := range certs[1:] {
			if cert.IsCA && !crossSigned(cert, c) {
				s.AlsoTrusted = append(s.AlsoTrusted, c.Subject.CommonName)
			}
		}
		s.DaysLeft = int(cert.NotAfter.Sub(now).Hours() / 24)
		due := renewAt(cert)
		if cert.IsCA {
			due = cert.NotAfter.Add(-renewBefore)
		}
		switch {
		case now.After(cert.NotAfter):
			s.Status = StatusExpired
		case !now.Before(due):
			s.Status = StatusWarn
		}
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("check certificates in %s: %w", dir, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// Services names the leaf certificates `kelp certificate rotate --service`
// takes, by what uses them.
func (f Files) Services() map[string][]Pair {
	return map[string][]Pair{
		"admin":              {f.Admin},
		"apiserver":          {f.APIServer, f.APIServerKubeletClient},
		"auth-proxy":         {f.AuthProxy},
		"controller-manager": {f.ControllerManager},
		"scheduler":          {f.Scheduler},
		"kubelet":            {f.KubeletClient, f.KubeletServing},
		"kube-proxy":         {f.KubeProxy},
		"dns":                {f.DNS},
		"controller":         {f.Controller},
		"etcd":               {f.EtcdServer, f.EtcdClient, f.EtcdPeer},
	}
}

// ServiceNames lists Services' names, sorted.
func (f Files) ServiceNames() []string {
	var names []string
	for name := range f.Services() {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Rotate moves the leaf certificates of services (all when none is named)
// aside, as <name>.crt.rotated-<time>, so that the server issues new ones
// when it starts next. CAs are never touched.
func Rotate(dir string, services []string, now time.Time) ([]string, error) {
	f := FilesIn(dir)
	all := f.Services()
	if len(services) == 0 {
		services = f.ServiceNames()
	}
	var pairs []Pair
	for _, s := range services {
		p, ok := all[s]
		if !ok {
			return nil, fmt.Errorf("unknown service %q: want one of %s", s, strings.Join(f.ServiceNames(), ", "))
		}
		pairs = append(pairs, p...)
	}
	stamp := now.UTC().Format("20060102T150405Z")
	var moved []string
	for _, p := range pairs {
		for _, path := range []string{p.Cert, p.Key} {
			if _, err := os.Stat(path); os.IsNotExist(err) {
				continue
			}
			if err := os.Rename(path, path+".rotated-"+stamp); err != nil {
				return moved, fmt.Errorf("move %s aside: %w", path, err)
			}
			moved = append(moved, path)
		}
	}
	return moved, syncDirs(dir)
}

func syncDirs(dir string) error {
	for _, d := range []string{dir, filepath.Join(dir, "etcd")} {
		if err := atomicfile.SyncDir(d); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}
