package controllermanager

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kelp-dev/kelp/internal/pki"
)

func TestArgs(t *testing.T) {
	cfg := Config{
		Kubeconfig:     "/cred/controller.kubeconfig",
		ClusterCIDRs:   []netip.Prefix{netip.MustParsePrefix("10.42.0.0/16")},
		ServiceCIDRs:   []netip.Prefix{netip.MustParsePrefix("10.43.0.0/16")},
		Certs:          pki.FilesIn("/tls"),
		LeaderElection: true,
	}
	args := Args(cfg)
	for _, want := range []string{
		"--kubeconfig=/cred/controller.kubeconfig",
		"--leader-elect=true",
		"--leader-elect-retry-period=10s",
		"--leader-elect-lease-duration=60s",
		"--allocate-node-cidrs=true",
		"--cluster-cidr=10.42.0.0/16",
		"--service-cluster-ip-range=10.43.0.0/16",
		"--root-ca-file=/tls/server-ca.crt",
		"--service-account-private-key-file=/tls/service.key",
		"--use-service-account-credentials=true",
		"--cluster-signing-kubelet-client-cert-file=/tls/client-ca-signer.crt",
		"--cluster-signing-kubelet-client-key-file=/tls/client-ca.key",
		"--cluster-signing-kubelet-serving-cert-file=/tls/kubelet-ca-signer.crt",
		"--cluster-signing-kubelet-serving-key-file=/tls/kubelet-ca.key",
		"--bind-address=127.0.0.1",
		"--authentication-skip-lookup=true",
		"--feature-gates=ControllerManagerReleaseLeaderElectionLockOnExit=true",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("missing %s in %v", want, args)
		}
	}
	cfg.LeaderElection = false
	if args := Args(cfg); !slices.Contains(args, "--leader-elect=false") || slices.Contains(args, "--leader-elect-retry-period=10s") {
		t.Errorf("without leader election: %v", args)
	}
	dual := cfg
	dual.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("fd42::/56"), netip.MustParsePrefix("10.42.0.0/16")}
	dual.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("fd43::/112"), netip.MustParsePrefix("10.43.0.0/16")}
	if args := Args(dual); !slices.Contains(args, "--cluster-cidr=fd42::/56,10.42.0.0/16") || !slices.Contains(args, "--service-cluster-ip-range=fd43::/112,10.43.0.0/16") {
		t.Errorf("dual-stack, the primary first: %v", args)
	}
	cfg.LeaderElection = true
	cfg.ExtraArgs = []string{"leader-elect=false", "node-cidr-mask-size=26"}
	args = Args(cfg)
	if !slices.Contains(args, "--leader-elect=false") || slices.Contains(args, "--leader-elect=true") || !slices.Contains(args, "--node-cidr-mask-size=26") {
		t.Errorf("user args must override: %v", args)
	}
}
