// Command coredns is upstream CoreDNS (coremain, with its own flags: -conf
// FILE) with the plugins that the Gateway API conformance suite's base
// manifests configure (errors, log, whoami, forward): the cluster tests
// pack it as the suite's registry.k8s.io/coredns/coredns image, as no
// registry is reachable.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/whoami"
)

func main() {
	coremain.Run()
}
