# Helpers the bench scripts share; sourced by them, not run.

now_ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
secs() { awk -v ms="$1" 'BEGIN { printf "%.2f", ms / 1000 }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# build_test_image REPO DIR: the test image, testapp packed by the bundle's
# image tool, as DIR/testapp.tar (docker.io/kelp-test/testapp:1.0).
build_test_image() {
  CGO_ENABLED=0 go build -C "$1" -trimpath -o "$2/testapp" ./internal/testcluster/testapp
  (cd "$1/scripts/bundle" && go run ./mkimage -binary "$2/testapp" -path /testapp \
    -name docker.io/kelp-test/testapp:1.0 -arch "$(go env GOARCH)" -out "$2/testapp.tar")
}

# start_node WORK: a network and mount namespace for one kelp node, like the
# cluster tests': loopback, a bridge with 10.99.0.2, private /run/kelp,
# /run/netns and /var/lib/kubelet. Sets holder to the pid that holds it.
start_node() {
  for d in /run/kelp /run/netns /var/lib/kubelet; do mkdir -p "$d"; done
  mkfifo "$1/ready"
  unshare --net --mount --propagation private sh -ec '
    ip link set lo up
    ip link add kelp-lab type bridge
    ip addr add 10.99.0.2/24 dev kelp-lab
    ip link set kelp-lab up
    for d in /run/kelp /run/netns /var/lib/kubelet; do mount -t tmpfs -o mode=0755 kelp-bench $d; done
    echo ready > "$0"
    exec sleep infinity' "$1/ready" &
  holder=$!
  read -r _ <"$1/ready"
}
