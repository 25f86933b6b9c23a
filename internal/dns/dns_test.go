package dns

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCorefile(t *testing.T) {
	got := Corefile(Config{
		Address:    netip.MustParseAddr("10.43.0.10"),
		Domain:     "edge.local",
		Kubeconfig: "/var/lib/kelp/agent/dns.kubeconfig",
		ResolvConf: "/run/systemd/resolve/resolv.conf",
	}, Custom{})
	for _, want := range []string{
		"bind 10.43.0.10\n",
		"kubernetes edge.local in-addr.arpa ip6.arpa {",
		"kubeconfig /var/lib/kelp/agent/dns.kubeconfig\n",
		"fallthrough in-addr.arpa ip6.arpa\n",
		"forward . /run/systemd/resolve/resolv.conf\n",
		"cache 30\n",
		"loop\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Corefile lacks %q:\n%s", want, got)
		}
	}
}

func TestCorefileCustom(t *testing.T) {
	custom := CustomOf(map[string]string{
		"hosts":        "10.1.2.3 legacy.example\n  10.1.2.4 other.example  \n",
		"b.server":     "b.example:53 {\n    bind 10.43.0.10\n}\n",
		"a.server":     "a.example:53 {\n    bind 10.43.0.10\n}\n",
		"ignored.conf": "not a server block",
	})
	got := Corefile(Config{Address: netip.MustParseAddr("10.43.0.10"), Domain: "cluster.local"}, custom)
	for _, want := range []string{
		"    hosts {\n        10.1.2.3 legacy.example\n        10.1.2.4 other.example\n        fallthrough\n    }\n    kubernetes cluster.local",
		"}\na.example:53 {\n    bind 10.43.0.10\n}\n\nb.example:53 {",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Corefile lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "not a server block") {
		t.Errorf("a key without .server made it in:\n%s", got)
	}
	if plain := Corefile(Config{Address: netip.MustParseAddr("10.43.0.10"), Domain: "cluster.local"}, Custom{}); strings.Contains(plain, "hosts") {
		t.Errorf("no hosts block without hosts:\n%s", plain)
	}
}

func TestBoundAddress(t *testing.T) {
	dir := t.TempDir()
	custom := Custom{ServerBlocks: []string{"corp.example:53 {\n    bind 10.43.0.99\n}\n"}}
	for _, tc := range []struct {
		name, corefile, want string
	}{
		{"ipv4", Corefile(Config{Address: netip.MustParseAddr("10.43.0.10"), Domain: "cluster.local"}, custom), "10.43.0.10"},
		{"ipv6", Corefile(Config{Address: netip.MustParseAddr("fd43::a"), Domain: "cluster.local"}, custom), "fd43::a"},
		{"no bind", ".:53 {\n    errors\n}\n", ""},
		{"bad bind", ".:53 {\n    bind lo\n}\n", ""},
		{"missing", "", ""},
	} {
		path := filepath.Join(dir, tc.name)
		if tc.name != "missing" {
			if err := os.WriteFile(path, []byte(tc.corefile), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		got, err := BoundAddress(path)
		if tc.want == "" {
			if err == nil {
				t.Errorf("%s: %s, want an error", tc.name, got)
			}
			continue
		}
		if err != nil || got != netip.MustParseAddr(tc.want) {
			t.Errorf("%s: %s, %v; want %s", tc.name, got, err, tc.want)
		}
	}
}
