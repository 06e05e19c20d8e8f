# Arbiter build. Users need only Go; `make generate` also needs clang.
GO       ?= go
BIN      := bin
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
# The one build line of the arbiter binary: static (CGO off), paths trimmed,
# version stamped. build and dist both use it; GOOS/GOARCH come from the
# environment. CGO=1 builds with cgo instead, which lets the daemon load
# NVML for its GPU inventory (docs/architecture.md, "NVML and cgo").
CGO      ?= 0
GOBUILD   = CGO_ENABLED=$(CGO) $(GO) build -trimpath -ldflags '$(LDFLAGS)'
# dist: where `make dist` writes binaries, packages and SHA256SUMS, and for
# which architectures.
DIST        ?= dist
DIST_ARCHES ?= amd64 arm64
# Package file times: the last commit's, so that a rebuild gives the same bytes.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || date +%s)
# Benchmarks: count and time per benchmark; override for quicker runs.
BENCHTIME ?= 1s

.PHONY: all build arbiter dist generate pgo test bench demo clean fmt vet gpu-validate-bundle gpu-validate

all: build

## build: the arbiter binary (static, CGO off) and the stub CUDA driver
## the tests and demo use (which needs gcc)
build: arbiter
	$(GO) run ./internal/cudastub/cmd/stubbuild -out $(BIN)/stub

## arbiter: the arbiter binary alone: Go only, no C compiler (a GPU server)
arbiter:
	$(GOBUILD) -o $(BIN)/arbiter ./cmd/arbiter

## dist: linux binaries for every DIST_ARCHES, their .deb and .rpm packages
## (built with nfpm by internal/dist, from deploy/nfpm.yaml) and SHA256SUMS,
## in $(DIST)
dist:
	mkdir -p $(DIST)
	rm -f $(DIST)/arbiter-linux-* $(DIST)/*.deb $(DIST)/*.rpm $(DIST)/SHA256SUMS
	for arch in $(DIST_ARCHES); do \
		GOOS=linux GOARCH=$$arch $(GOBUILD) -o $(DIST)/arbiter-linux-$$arch ./cmd/arbiter || exit 1; \
	done
	cd internal/dist && SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(GO) run ./cmd/pkg \
		-root $(CURDIR) -version '$(VERSION)' -out $(abspath $(DIST)) \
		$(foreach arch,$(DIST_ARCHES),-bin $(arch)=$(abspath $(DIST))/arbiter-linux-$(arch))
	cd $(DIST) && sha256sum arbiter-linux-* *.deb *.rpm > SHA256SUMS

## generate: rebuild the eBPF objects with clang (committed; users skip this)
generate:
	$(GO) generate ./bpf/...

## pgo: cmd/arbiter/default.pgo, the CPU profile every `go build` of the
## binary optimizes with (profile-guided: the hot calls inlined);
## committed, so users build with Go alone. It profiles the
## simulator on every shipped example under every baseline, three times
## (BenchmarkExamplesHour); rebuild it after large changes to the simulator
pgo:
	$(GO) test -count=1 -run '^$$' -bench 'ExamplesHour/one-at-a-time' -benchtime 3x \
		-o $(BIN)/whatif.test -cpuprofile cmd/arbiter/default.pgo ./sim/whatif
	rm -f $(BIN)/whatif.test

## test: vet and the whole test suite (eBPF tests need root; CI sets
## ARBITER_REQUIRE_BPF=1), then the packaging module's (internal/dist, a
## module of its own)
test:
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 30m ./...
	cd internal/dist && $(GO) vet ./... && $(GO) test -count=1 -timeout 20m ./...

## bench: every benchmark under ./..., one package at a time (two running at
## once on a small machine would time each other), built with the binary's
## profile (default.pgo) so that they measure the code as it ships; figures
## in docs/benchmarks.md
bench:
	$(GO) test -count=1 -p 1 -pgo=$(CURDIR)/cmd/arbiter/default.pgo -run '^$$' -bench . -benchtime $(BENCHTIME) -timeout 60m ./...

## demo: trace the stub inference and training workloads live (root)
demo: build
	./scripts/demo.sh

## gpu-validate-bundle: everything scripts/gpu-validate.sh needs on a GPU
## server without Go, in $(BIN)/gpu-validate and $(BIN)/gpu-validate.tar.gz
gpu-validate-bundle:
	CGO=$(CGO) GO=$(GO) ./scripts/gpu-validate-bundle.sh $(BIN)/gpu-validate

## gpu-validate: build the bundle and run the GPU validation here (root, a
## GPU); the report goes to gpu-validation.md
gpu-validate: gpu-validate-bundle
	$(BIN)/gpu-validate/gpu-validate.sh --out gpu-validation.md

## manifests: render deploy/kubernetes from the Helm chart's default values
## and copy the default policy into the chart (a test checks both are current)
manifests:
	$(GO) test -count=1 ./deploy/kubernetes -run 'TestManifestsCurrent|TestChartPolicyIsTheDefault' -update

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
