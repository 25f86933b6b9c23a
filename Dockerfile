# syntax=docker/dockerfile:1
#
# kelp as a container, k3d-style: one privileged container is one node.
#
#   docker build -t kelp .
#   docker run -d --name kelp --privileged --cgroupns=private \
#     --tmpfs /run --tmpfs /var/run -v kelp-data:/var/lib/kelp \
#     -p 6443:6443 kelp server
#   docker exec kelp kubectl get nodes
#
# --privileged gives kelp what a node needs: all capabilities, /dev/kmsg
# (the kubelet reads kernel OOM messages there), a writable /sys/fs/cgroup
# (the kubelet and runc make the pods' cgroups) and no seccomp or AppArmor
# profile in the way of runc. /var/lib/kelp must be a volume: containerd's
# overlayfs snapshots cannot live on the container's own overlayfs.
#
# The image is the directory scripts/rootfs.sh builds and nothing else; the
# test in internal/container runs that directory as this file describes it.

# The Go version of go.mod's `go` line (checked by internal/container).
ARG GO_VERSION=1.26.8

# The builder runs on the build machine's own platform and cross-builds for
# TARGETARCH (amd64 or arm64; buildx sets it): scripts/bundle.sh cross-builds
# runc with Debian's cross gcc and libseccomp-dev:arm64, and rootfs.sh takes
# busybox-static of that architecture.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
ARG TARGETARCH
WORKDIR /src
COPY . .
# build.sh apt-get installs what it needs (libseccomp-dev for runc, gcc,
# file), rootfs.sh fetches busybox-static with apt-get download; none of it
# reaches the final image but the files rootfs.sh lists.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    scripts/build.sh "${TARGETARCH}" && \
    scripts/rootfs.sh /rootfs "${TARGETARCH}"

FROM scratch
COPY --from=build /rootfs/ /
ENV PATH=/bin
VOLUME ["/var/lib/kelp", "/var/lib/kubelet", "/var/log"]
EXPOSE 6443
ENTRYPOINT ["/bin/kelp"]
CMD ["server"]
