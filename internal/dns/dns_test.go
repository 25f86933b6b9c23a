package dns

import (
	"net/netip"
	"strings"
	"testing"
)

func TestCorefile(t *testing.T) {
	got := Corefile(Config{
		Address:    netip.MustParseAddr("10.43.0.10"),
		Domain:     "edge.local",
		Kubeconfig: "/var/lib/kelp/agent/dns.kubeconfig",
		ResolvConf: "/run/systemd/resolve/resolv.conf",
	})
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
