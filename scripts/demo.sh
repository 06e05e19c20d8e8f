#!/usr/bin/env bash
# Demo: trace the stub CUDA driver's inference and training workloads live
# with eBPF, on any Linux machine (no GPU needed). `make demo` builds first.
#
# Starts bin/stub/infer (requests at 100/s: copy, 8 launches, copy, sync)
# and bin/stub/train (long launches, a sync every 8), runs
# `arbiter trace --duration 10s` on them, shows a few events of each, the
# per-process summary, one event as JSON from the recording, and stops the
# workloads on any exit. Then scripts/demo-colocate.sh runs inference alone,
# training alone and both side by side on the stub's shared emulated GPU and
# prints LC latency and BE throughput for each (COLOCATE_SECONDS per run,
# default 3). Tracing needs root (CAP_BPF + CAP_PERFMON): when not
# root it runs that part with sudo.
#
# When a step fails, the demo prints what it said (the tracer's error names
# the missing privilege or kernel feature and the fix) and exits with its
# status (77 for a missing privilege or kernel feature).
#
# Environment: DURATION (default 10s) is how long to trace; ARBITER_BIN
# (default bin/arbiter) and ARBITER_STUB (default bin/stub) point the demo
# at another build, relative to the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
arbiter=${ARBITER_BIN:-bin/arbiter}
stub=${ARBITER_STUB:-bin/stub}
for f in "$arbiter" "$stub/infer" "$stub/train" "$stub/libcuda.so.1"; do
	if [ ! -x "$f" ] && [ ! -f "$f" ]; then
		echo "demo: $f is missing: run 'make build' (or 'make demo', which builds first)" >&2
		exit 1
	fi
done

sudo=()
if [ "$(id -u)" -ne 0 ]; then
	if ! command -v sudo >/dev/null; then
		echo "demo: tracing needs root (CAP_BPF and CAP_PERFMON) and sudo is not installed: run 'make demo' as root" >&2
		exit 77
	fi
	echo "demo: tracing needs root (CAP_BPF and CAP_PERFMON); running the trace with sudo"
	sudo=(sudo)
fi

workdir=$(mktemp -d /tmp/arbiter-demo.XXXXXX)
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	pids=()
	rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Headings in bold on a terminal, plain where the output goes to a file.
if [ -t 1 ]; then
	bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }
else
	bold() { printf '\n%s\n' "$*"; }
fi

# failed STATUS WHAT LOG: say that WHAT failed, show what it wrote to LOG
# and exit with its status (cleanup still stops the workloads).
failed() {
	echo "demo: $2 failed (exit status $1); it said:" >&2
	sed 's/^/  /' "$3" >&2
	exit "$1"
}

bold "Starting two CUDA programs on the stub driver ($stub/libcuda.so.1):"
LD_LIBRARY_PATH=$stub "$stub/infer" --rate 100 --launches 8 --kernel-us 200 --bytes 1048576 &
pids+=($!)
echo "  infer  pid $!  inference: 100 requests/s, each = H2D copy, 8 × 200 µs kernels, D2H copy, sync"
LD_LIBRARY_PATH=$stub "$stub/train" --kernel-us 5000 --sync-every 8 &
pids+=($!)
echo "  train  pid $!  training: endless 5 ms kernels, a sync every 8"
sleep 0.5
for p in "${pids[@]}"; do
	if ! kill -0 "$p" 2>/dev/null; then
		status=0
		wait "$p" || status=$?
		echo "demo: workload pid $p exited at once (exit status $status): see its message above; is $stub/libcuda.so.1 the stub driver?" >&2
		exit 1
	fi
done

rec=$workdir/demo.arbt
bold "arbiter trace --duration $DURATION --pid ${pids[0]} --pid ${pids[1]} --record $rec"
echo "(one inference request, the first training launches and sync; the rest are counted in the summary)"
# awk reads every line, so the tracer never writes into a closed pipe.
# The tracer's stderr (what it attached, the summary, or why it failed) is
# shown after the events.
set +e
"${sudo[@]}" "$arbiter" trace --duration "$DURATION" --pid "${pids[0]}" --pid "${pids[1]}" --record "$rec" \
	2>"$workdir/trace.err" |
	awk '$3 == "infer" && ni++ < 11 { print; fflush() }
	     $3 == "train" && $4 == "launch" && nl++ < 2 { print; fflush() }
	     $3 == "train" && $4 == "sync" && ns++ < 1 { print; fflush() }
	     END { if (NR > 0) printf "... %d events in all\n", NR }'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
	failed "$status" "arbiter trace" "$workdir/trace.err"
fi
cat "$workdir/trace.err"
"${sudo[@]}" chown "$(id -u):$(id -g)" "$rec"

bold "The recording replays without privileges; one sync as JSON:"
status=0
"$arbiter" trace --replay "$rec" --format json --comm infer 2>"$workdir/replay.err" >"$workdir/replay.json" || status=$?
if [ "$status" -ne 0 ]; then
	failed "$status" "arbiter trace --replay" "$workdir/replay.err"
fi
awk '/"kind":"sync"/ { print; exit }' "$workdir/replay.json"

bold "Stopping the workloads (they report what they saw themselves):"
cleanup
trap - EXIT

bold "Inference beside training on one shared stub GPU (scripts/demo-colocate.sh)"
status=0
COLOCATE_SECONDS=${COLOCATE_SECONDS:-3} ARBITER_STUB="$stub" ARBITER_BIN="$arbiter" scripts/demo-colocate.sh || status=$?
if [ "$status" -ne 0 ]; then
	echo "demo: the co-location runs failed (exit status $status): see their message above" >&2
	exit "$status"
fi

bold "What-if: inference beside training in the GPU simulator (arbiter sim)"
echo "(examples/workloads/timeslice-inflation.yaml: the driver's default time-slicing vs running alone, MPS-like sharing, ideal priority,"
echo " and the arbiter baseline: the default policy and the engine in the loop)"
"$arbiter" sim --workload examples/workloads/timeslice-inflation.yaml --duration 20s --quiet --policy rego/default

bold "Next: on a GPU server, 'sudo ./bin/arbiter trace' shows real CUDA programs the same way."
