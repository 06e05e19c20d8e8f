#!/usr/bin/env bash
# Build, on a development machine, everything scripts/gpu-validate.sh needs
# on a GPU server that has no Go: static binaries (CGO off) and the sources
# the server compiles itself (CUDA with its nvcc, PyTorch through python3).
#
# Usage: scripts/gpu-validate-bundle.sh [DIR]   (default bin/gpu-validate)
# Writes DIR/{gpu-validate.sh, gpu-validate-sections.sh, arbiter, nvrm.test,
# gpureport, src/, VERSION}
# and DIR.tar.gz; copy either to the server and run, as root,
#   ./gpu-validate.sh --out gpu-validation.md
# GOOS/GOARCH may be set to build for another server (GOARCH=arm64); CGO=1
# builds arbiter with cgo (NVML).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
OUT=${1:-bin/gpu-validate}
command -v "$GO" >/dev/null || {
	echo "gpu-validate-bundle: go not found: install Go (see README.md) or set GO=/path/to/go" >&2
	exit 1
}
VERSION=$(git describe --tags --always --dirty 2>/dev/null || echo dev)

rm -rf "$OUT"
mkdir -p "$OUT/src"
# Static unless CGO=1, which builds arbiter with cgo so that it loads NVML
# for its GPU inventory (docs/architecture.md, "NVML and cgo"); the server
# then needs a glibc at least as new as this machine's.
export CGO_ENABLED=${CGO:-0}
echo "gpu-validate-bundle: arbiter" >&2
"$GO" build -trimpath -ldflags "-s -w -X main.version=$VERSION" -o "$OUT/arbiter" ./cmd/arbiter
echo "gpu-validate-bundle: gpureport" >&2
"$GO" build -trimpath -o "$OUT/gpureport" ./internal/gpuvalidate/cmd/gpureport
echo "gpu-validate-bundle: nvrm.test" >&2
"$GO" test -c -trimpath -o "$OUT/nvrm.test" ./nvrm
cp scripts/gpu-validate.sh scripts/gpu-validate-sections.sh "$OUT/"
chmod +x "$OUT/gpu-validate.sh"
cp internal/gpuvalidate/workloads/*.cu internal/gpuvalidate/workloads/*.py "$OUT/src/"
echo "$VERSION" >"$OUT/VERSION"
tar -C "$(dirname "$OUT")" -czf "$OUT.tar.gz" "$(basename "$OUT")"
echo "gpu-validate-bundle: $OUT and $OUT.tar.gz ($VERSION): copy to the GPU server and run, as root, ./gpu-validate.sh --out gpu-validation.md" >&2
