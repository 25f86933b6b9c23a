package registries

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"sigs.k8s.io/yaml"

	"github.com/kelp-dev/kelp/internal/atomicfile"
	"github.com/kelp-dev/kelp/internal/containerd"
)

// Registries is the content of registries.yaml.
type Registries struct {
	Mirrors map[string]Mirror `json:"mirrors"`
	Configs map[string]Config `json:"configs"`
}

// Mirror lists the endpoints tried, in order, for one registry.
type Mirror struct {
	Endpoints []string          `json:"endpoint"`
	Rewrites  map[string]string `json:"rewrite"`
}

// Config is how to talk to one registry host.
type Config struct {
	Auth *Auth `json:"auth"`
	TLS  *TLS  `json:"tls"`
}

// Auth holds registry credentials.
type Auth struct {
	Username      string `json:"username"`
	Password      string `json:"password"`
	Auth          string `json:"auth"`
	IdentityToken string `json:"identitytoken"`
}

// TLS configures the connection to a registry host.
type TLS struct {
	CAFile             string `json:"ca_file"`
	CertFile           string `json:"cert_file"`
	KeyFile            string `json:"key_file"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify"`
}

// Load reads path; a missing file means no mirrors and no credentials.
func Load(path string) (Registries, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Registries{}, nil
	}
	if err != nil {
		return Registries{}, fmt.Errorf("registries: %w", err)
	}
	var r Registries
	if err := yaml.UnmarshalStrict(data, &r); err != nil {
		// The YAML library reports through its JSON decoder; say only what
		// is wrong.
		msg := err.Error()
		if i := strings.LastIndex(msg, "json: "); i >= 0 {
			msg = msg[i+len("json: "):]
		} else if i := strings.Index(msg, "yaml: "); i >= 0 {
			msg = msg[i:]
		}
		return Registries{}, fmt.Errorf("registries: %s: %s (see README: Private registries)", path, msg)
	}
	for name, m := range r.Mirrors {
		if len(m.Rewrites) > 0 {
			return Registries{}, fmt.Errorf("registries: %s: mirrors.%s.rewrite is not supported by kelp's containerd; push the images under the mirror's own paths instead", path, name)
		}
		for _, e := range m.Endpoints {
			if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return Registries{}, fmt.Errorf("registries: %s: mirrors.%s endpoint %q: want an http:// or https:// URL", path, name, e)
			}
		}
	}
	return r, nil
}

// Auth returns the credentials per registry host, for containerd's config.
func (r Registries) Auth() map[string]containerd.RegistryAuth {
	out := map[string]containerd.RegistryAuth{}
	for host, c := range r.Configs {
		if c.Auth != nil {
			out[host] = containerd.RegistryAuth{Username: c.Auth.Username, Password: c.Auth.Password, Auth: c.Auth.Auth, IdentityToken: c.Auth.IdentityToken}
		}
	}
	return out
}

// WriteHosts replaces dir with one <registry>/hosts.toml per registry that
// has mirrors or TLS settings. With a localMirror (the embedded registry
// mirror's URL), every registry of mirrors tries it first.
func (r Registries) WriteHosts(dir, localMirror string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("registries: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("registries: %w", err)
	}
	for name, data := range r.hostsFiles(localMirror) {
		sub := filepath.Join(dir, name)
		if err := os.MkdirAll(sub, 0o700); err != nil {
			return fmt.Errorf("registries: %w", err)
		}
		if err := atomicfile.Write(filepath.Join(sub, "hosts.toml"), data, 0o600); err != nil {
			return fmt.Errorf("registries: %w", err)
		}
	}
	return nil
}

// hostsFiles renders hosts.toml per registry name. A mirror named "*"
// applies to every registry without its own entry (containerd's _default).
func (r Registries) hostsFiles(localMirror string) map[string][]byte {
	names := map[string]bool{}
	for name := range r.Mirrors {
		names[name] = true
	}
	for host, c := range r.Configs {
		if c.TLS != nil {
			names[host] = true
		}
	}
	out := map[string][]byte{}
	for name := range names {
		top := map[string]any{}
		dirName := name
		if name == "*" {
			dirName = "_default"
		} else {
			top["server"] = upstream(name)
			maps.Copy(top, r.tlsFields(name))
		}
		var b bytes.Buffer
		_ = toml.NewEncoder(&b).Encode(top) // maps of strings and bools always encode
		// containerd tries the hosts in file order: the endpoints' order.
		endpoints := r.Mirrors[name].Endpoints
		if _, mirrored := r.Mirrors[name]; mirrored && localMirror != "" {
			endpoints = append([]string{localMirror}, endpoints...)
		}
		for _, e := range endpoints {
			h := map[string]any{"capabilities": []string{"pull", "resolve"}}
			if e == localMirror {
				// The nodes give each other content by digest only: the
				// local mirror answers no tag, so containerd resolves tags
				// with the admin's mirrors and the registry alone, and
				// asks the local mirror for what it names by digest
				// (containerd pulls a digest from hosts that may pull).
				h["capabilities"] = []string{"pull"}
			}
			if u, err := url.Parse(e); err == nil {
				maps.Copy(h, r.tlsFields(u.Host))
			}
			fmt.Fprintf(&b, "\n[host.%q]\n", e)
			_ = toml.NewEncoder(&b).Encode(h)
		}
		out[dirName] = b.Bytes()
	}
	return out
}

func (r Registries) tlsFields(host string) map[string]any {
	c, ok := r.Configs[host]
	if !ok || c.TLS == nil {
		return nil
	}
	f := map[string]any{}
	if c.TLS.CAFile != "" {
		f["ca"] = c.TLS.CAFile
	}
	if c.TLS.CertFile != "" && c.TLS.KeyFile != "" {
		f["client"] = [][]string{{c.TLS.CertFile, c.TLS.KeyFile}}
	}
	if c.TLS.InsecureSkipVerify {
		f["skip_verify"] = true
	}
	return f
}

// Mirrored lists the registries of mirrors, those the embedded registry
// mirror shares between nodes; "*" is every registry.
func (r Registries) Mirrored() []string {
	return slices.Sorted(maps.Keys(r.Mirrors))
}

// upstream is the registry's own address; Docker Hub's API lives on
// registry-1.docker.io.
func upstream(name string) string {
	if name == "docker.io" {
		return "https://registry-1.docker.io"
	}
	return "https://" + name
}
