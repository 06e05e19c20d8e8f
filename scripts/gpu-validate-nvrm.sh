#!/usr/bin/env bash
# Validate Arbiter's driver channel control on a real NVIDIA GPU server:
# the driver sections of scripts/gpu-validate.sh (build, nvrm, channels),
# which replaces this script and runs every hardware check. This one builds
# the bundle first, so it needs Go on the server; gpu-validate.sh from a
# bundle built elsewhere (make gpu-validate-bundle) does not.
#
# Usage: sudo scripts/gpu-validate-nvrm.sh [OUT.md]   (TRIALS=100 GPU=0)
# ARBITER_ALLOW_UNVERIFIED_DRIVER=1 validates a driver newer than the newest
# Arbiter verified (gpu-validate.sh --allow-unverified-driver).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-gpu-validation-nvrm-$(date -u +%Y%m%dT%H%M%SZ).md}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
scripts/gpu-validate-bundle.sh "$TMP/gpu-validate"
"$TMP/gpu-validate/gpu-validate.sh" --sections build,nvrm,channels \
	--trials "${TRIALS:-100}" --gpu "${GPU:-0}" --out "$OUT"
echo "gpu-validate-nvrm: results in $OUT (append to docs/gpu-validation.md)" >&2
