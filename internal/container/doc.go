// Package container tests kelp's container image without a container
// engine: it builds the image's root filesystem with scripts/rootfs.sh, reads
// the Dockerfile's last stage for the environment, volumes and entrypoint,
// and runs that root filesystem the way `docker run --privileged` would, as
// PID 1 of its own namespaces on an overlay over the image, inside a
// testcluster node.
package container
