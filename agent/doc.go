// Package agent composes a kelp node: containerd, the kubelet, images and
// the pod network. `kelp server` runs one beside its control plane.
//
// `kelp agent` is the whole kelp binary, not a node-only program exec'd
// from the bundle: measured in one run, such a program saved 27 % of PSS
// (140 against 192 MiB) and 14.5 % of working set at the same idle CPU,
// for 25 MB more download, short of the 30 % that would be worth a second
// program. containerd, by contrast, runs as a binary of its own: started
// as kelp it would pay for kelp's package initialisation
// (scripts/bundle/containerd).
package agent
