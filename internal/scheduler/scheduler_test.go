package scheduler

import (
	"slices"
	"testing"
)

func TestArgs(t *testing.T) {
	args := Args(Config{Kubeconfig: "/cred/scheduler.kubeconfig", LeaderElection: true, ExtraArgs: []string{"v=3"}})
	for _, want := range []string{
		"--kubeconfig=/cred/scheduler.kubeconfig",
		"--authentication-kubeconfig=/cred/scheduler.kubeconfig",
		"--leader-elect=true",
		"--leader-elect-retry-period=10s",
		"--leader-elect-lease-duration=60s",
		"--bind-address=127.0.0.1",
		"--secure-port=10259",
		"--authentication-skip-lookup=true",
		"--v=3",
	} {
		if !slices.Contains(args, want) {
			t.Errorf("missing %s in %v", want, args)
		}
	}
}

func TestArgsWithoutLeaderElection(t *testing.T) {
	args := Args(Config{Kubeconfig: "/cred/scheduler.kubeconfig"})
	if !slices.Contains(args, "--leader-elect=false") {
		t.Errorf("want --leader-elect=false in %v", args)
	}
	for _, a := range args {
		if len(a) > len("--leader-elect-") && a[:len("--leader-elect-")] == "--leader-elect-" {
			t.Errorf("lease timing %s without leader election", a)
		}
	}
}
