// Command containerd is the containerd a kelp node runs: upstream's daemon
// (github.com/containerd/containerd/v2/cmd/containerd) with only the plugins
// kelp uses (builtins.go). It is a binary of its own rather than the kelp
// binary re-executed: a child started from kelp pages in kelp's package
// initialisation (115 MiB RSS as `kelp containerd`, 35 MiB standalone).
//
// Shims are told this binary's path as their publish binary
// (`containerd --address A publish …`), which command.App serves.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/cmd/containerd/command"
)

func main() {
	if err := command.App().Run(context.Background(), os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "containerd: %s\n", err)
		os.Exit(1)
	}
}
