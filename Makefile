# A thin wrapper over scripts/; the scripts are the source of truth.
ARCH ?= $(shell go env GOARCH)

.PHONY: all bundle test bench clean
all:
	scripts/build.sh $(ARCH)
bundle:
	scripts/bundle.sh $(ARCH)
test:
	scripts/test.sh
bench:
	scripts/bench.sh
clean:
	rm -rf bin
