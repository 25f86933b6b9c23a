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
