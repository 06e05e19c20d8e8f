# Arbiter build. Users need only Go; `make generate` also needs clang.
GO       ?= go
BIN      := bin
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
# Benchmarks: count and time per benchmark; override for quicker runs.
BENCHTIME ?= 1s

.PHONY: all build generate test bench demo clean fmt vet gpu-validate-bundle gpu-validate

all: build

## build: the arbiter binary (static, CGO off) and the stub CUDA driver
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/arbiter ./cmd/arbiter
	$(GO) run ./internal/cudastub/cmd/stubbuild -out $(BIN)/stub

## generate: rebuild the eBPF objects with clang (committed; users skip this)
generate:
	$(GO) generate ./bpf/...

## test: vet and the whole test suite (eBPF tests need root; CI sets ARBITER_REQUIRE_BPF=1)
test:
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 30m ./...

## bench: every benchmark under ./..., one package at a time (two running at
## once on a small machine would time each other), figures in docs/benchmarks.md
bench:
	$(GO) test -count=1 -p 1 -run '^$$' -bench . -benchtime $(BENCHTIME) -timeout 60m ./...

## demo: trace the stub inference and training workloads live (root)
demo: build
	./scripts/demo.sh

## gpu-validate-bundle: everything scripts/gpu-validate.sh needs on a GPU
## server without Go, in $(BIN)/gpu-validate and $(BIN)/gpu-validate.tar.gz
gpu-validate-bundle:
	GO=$(GO) ./scripts/gpu-validate-bundle.sh $(BIN)/gpu-validate

## gpu-validate: build the bundle and run the GPU validation here (root, a
## GPU); the report goes to gpu-validation.md
gpu-validate: gpu-validate-bundle
	$(BIN)/gpu-validate/gpu-validate.sh --out gpu-validation.md

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN)
