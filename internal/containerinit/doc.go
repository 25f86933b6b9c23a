// Package containerinit lets kelp be PID 1 of a container, the entrypoint
// of its image. The kernel hands every orphan to PID 1, containerd's shims
// among them, and only PID 1 can reap them; on cgroup v2 the root of a
// private cgroup namespace must hold no process before the kubelet can
// enable controllers for kubepods below it.
package containerinit
