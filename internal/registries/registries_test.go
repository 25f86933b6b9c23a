package registries

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"

	"github.com/kelp-dev/kelp/internal/containerd"
)

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "registries.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadMissingFile(t *testing.T) {
	r, err := Load(filepath.Join(t.TempDir(), "absent.yaml"))
	if err != nil || r.Mirrors != nil || r.Configs != nil {
		t.Errorf("got %+v, %v; want empty, nil", r, err)
	}
}

func TestLoadValid(t *testing.T) {
	path := writeFile(t, `
mirrors:
  docker.io:
    endpoint:
      - "https://mirror1:5000"
      - "http://mirror2"
configs:
  "mirror1:5000":
    auth:
      username: user
      password: pass
    tls:
      ca_file: /etc/ssl/ca.pem
      cert_file: /etc/ssl/client.pem
      key_file: /etc/ssl/client.key
      insecure_skip_verify: true
`)
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Registries{
		Mirrors: map[string]Mirror{"docker.io": {Endpoints: []string{"https://mirror1:5000", "http://mirror2"}}},
		Configs: map[string]Config{"mirror1:5000": {
			Auth: &Auth{Username: "user", Password: "pass"},
			TLS:  &TLS{CAFile: "/etc/ssl/ca.pem", CertFile: "/etc/ssl/client.pem", KeyFile: "/etc/ssl/client.key", InsecureSkipVerify: true},
		}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    []string
	}{
		{"unknown key", "mirrors:\n  docker.io:\n    endpoints: [\"https://m\"]\n", []string{"unknown field", "endpoints"}},
		{"unknown top-level key", "mirror: {}\n", []string{"unknown field"}},
		{"rewrite", "mirrors:\n  docker.io:\n    endpoint: [\"https://m\"]\n    rewrite:\n      \"^(.*)\": \"lib/$1\"\n", []string{"mirrors.docker.io.rewrite"}},
		{"endpoint without scheme", "mirrors:\n  docker.io:\n    endpoint: [\"mirror1:5000\"]\n", []string{`"mirror1:5000"`, "http:// or https://"}},
		{"endpoint with other scheme", "mirrors:\n  docker.io:\n    endpoint: [\"ftp://mirror1\"]\n", []string{"http:// or https://"}},
		{"endpoint without host", "mirrors:\n  docker.io:\n    endpoint: [\"https://\"]\n", []string{"http:// or https://"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.content)
			_, err := Load(path)
			if err == nil {
				t.Fatal("no error")
			}
			// The user needs to know which file to fix.
			for _, want := range append(tt.want, path) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
}

func TestLoadSyntaxError(t *testing.T) {
	path := writeFile(t, "mirrors: [\n")
	_, err := Load(path)
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	if !strings.Contains(msg, path+": yaml: line 1") && !strings.Contains(msg, path+": error converting YAML") {
		t.Errorf("garbled error %q", msg)
	}
}

// hosts reads every dir/<name>/hosts.toml that WriteHosts produced.
func hosts(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name(), "hosts.toml"))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(data)
	}
	return out
}

func TestWriteHosts(t *testing.T) {
	type table = map[string]any
	pullResolve := []any{"pull", "resolve"}
	pull := []any{"pull"}
	tests := []struct {
		name        string
		r           Registries
		localMirror string
		want        map[string]table // directory → decoded hosts.toml
		order       map[string][]string
	}{
		{
			name: "mirror order and mirror TLS",
			r: Registries{
				Mirrors: map[string]Mirror{"docker.io": {Endpoints: []string{"https://mirror2", "https://mirror1:5000"}}},
				Configs: map[string]Config{"mirror1:5000": {TLS: &TLS{
					CAFile: "/ca.pem", CertFile: "/c.pem", KeyFile: "/c.key", InsecureSkipVerify: true,
				}}},
			},
			want: map[string]table{
				"docker.io": {"server": "https://registry-1.docker.io", "host": table{
					"https://mirror2": table{"capabilities": pullResolve},
					"https://mirror1:5000": table{
						"capabilities": pullResolve,
						"ca":           "/ca.pem",
						"client":       []any{[]any{"/c.pem", "/c.key"}},
						"skip_verify":  true,
					},
				}},
				// TLS-only entry for the mirror host itself.
				"mirror1:5000": {"server": "https://mirror1:5000", "ca": "/ca.pem",
					"client": []any{[]any{"/c.pem", "/c.key"}}, "skip_verify": true},
			},
			order: map[string][]string{"docker.io": {`[host."https://mirror2"]`, `[host."https://mirror1:5000"]`}},
		},
		{
			name: "endpoints kept in the order given",
			r:    Registries{Mirrors: map[string]Mirror{"docker.io": {Endpoints: []string{"https://mirror1", "https://mirror2"}}}},
			want: map[string]table{"docker.io": {"server": "https://registry-1.docker.io", "host": table{
				"https://mirror1": table{"capabilities": pullResolve},
				"https://mirror2": table{"capabilities": pullResolve},
			}}},
			order: map[string][]string{"docker.io": {
				"server = ", `[host."https://mirror1"]`, `[host."https://mirror2"]`,
			}},
		},
		{
			// "*" is containerd's _default, which has no upstream of its own.
			name: "wildcard mirror",
			r:    Registries{Mirrors: map[string]Mirror{"*": {Endpoints: []string{"http://cache:5000"}}}},
			want: map[string]table{"_default": {"host": table{"http://cache:5000": table{"capabilities": pullResolve}}}},
		},
		{
			name: "TLS without mirror",
			r: Registries{Configs: map[string]Config{
				"registry.example.com": {TLS: &TLS{CAFile: "/ca.pem", CertFile: "/only-cert.pem"}},
				// Credentials alone need no hosts.toml.
				"auth.example.com": {Auth: &Auth{Username: "u"}},
			}},
			// A cert without its key is not a client pair.
			want: map[string]table{"registry.example.com": {"server": "https://registry.example.com", "ca": "/ca.pem"}},
		},
		{name: "nothing", r: Registries{}, want: map[string]table{}},
		{
			// k3s's syntax: a mirror without endpoints opts the registry
			// in; the embedded mirror comes first, then the endpoints,
			// then the registry (server).
			name: "embedded mirror first",
			r: Registries{
				Mirrors: map[string]Mirror{"registry.example.com": {}, "docker.io": {Endpoints: []string{"https://mirror1"}}},
				Configs: map[string]Config{"tls.example.com": {TLS: &TLS{CAFile: "/ca.pem"}}},
			},
			localMirror: "http://127.0.0.1:5001",
			want: map[string]table{
				"registry.example.com": {"server": "https://registry.example.com", "host": table{"http://127.0.0.1:5001": table{"capabilities": pull}}},
				"docker.io": {"server": "https://registry-1.docker.io", "host": table{
					"http://127.0.0.1:5001": table{"capabilities": pull},
					"https://mirror1":       table{"capabilities": pullResolve},
				}},
				// Not a mirror: not shared.
				"tls.example.com": {"server": "https://tls.example.com", "ca": "/ca.pem"},
			},
			order: map[string][]string{"docker.io": {`[host."http://127.0.0.1:5001"]`, `[host."https://mirror1"]`}},
		},
		{
			name:        "embedded mirror for every registry",
			r:           Registries{Mirrors: map[string]Mirror{"*": {}}},
			localMirror: "http://127.0.0.1:5001",
			want:        map[string]table{"_default": {"host": table{"http://127.0.0.1:5001": table{"capabilities": pull}}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "registries.d")
			// Left over from a previous run with another registries.yaml.
			if err := os.MkdirAll(filepath.Join(dir, "stale.example.com"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := tt.r.WriteHosts(dir, tt.localMirror); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, "stale.example.com")); !os.IsNotExist(err) {
				t.Errorf("stale directory kept: %v", err)
			}
			files := hosts(t, dir)
			got := map[string]table{}
			for name, data := range files {
				var doc table
				if err := toml.Unmarshal([]byte(data), &doc); err != nil {
					t.Fatalf("%s: %v\n%s", name, err, data)
				}
				got[name] = doc
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %#v\nwant %#v", got, tt.want)
			}
			for name, parts := range tt.order {
				rest := files[name]
				for _, p := range parts {
					i := strings.Index(rest, p)
					if i < 0 {
						t.Errorf("%s: %q missing or out of order in\n%s", name, p, files[name])
						break
					}
					rest = rest[i+len(p):]
				}
			}
		})
	}
}

func TestLoadMirrorWithoutEndpoints(t *testing.T) {
	r, err := Load(writeFile(t, "mirrors:\n  docker.io:\n  \"*\":\n  registry.example.com: {}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Mirrored(), []string{"*", "docker.io", "registry.example.com"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Mirrored() = %q, want %q", got, want)
	}
}

func TestAuth(t *testing.T) {
	r := Registries{Configs: map[string]Config{
		"a.example.com":   {Auth: &Auth{Username: "u", Password: "p"}},
		"b.example.com":   {Auth: &Auth{Auth: "dTpw", IdentityToken: "tok"}},
		"tls.example.com": {TLS: &TLS{CAFile: "/ca.pem"}},
	}}
	want := map[string]containerd.RegistryAuth{
		"a.example.com": {Username: "u", Password: "p"},
		"b.example.com": {Auth: "dTpw", IdentityToken: "tok"},
	}
	if got := r.Auth(); !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if got := (Registries{}).Auth(); len(got) != 0 {
		t.Errorf("empty registries: %v", got)
	}
}
