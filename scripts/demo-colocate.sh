#!/usr/bin/env bash
# Co-location on the stub driver's shared emulated GPU: the inference
# workload (LC) alone, the training workload (BE) alone, both side by side on
# one GPU, and both under `arbiter run`; prints LC p50/p99 latency and BE
# throughput side by side. scripts/demo.sh runs it after the trace; it also
# runs on its own, without root, after `make build`:
#
#   scripts/demo-colocate.sh
#
# LC: 100 requests/s, each 8 layers of 100 µs that the host waits on one
# by one (a decoder's steps). BE: back-to-back 1 ms kernels, each waited on
# (a training step's optimizer sync).
# Side by side every LC layer waits for BE's timeslice (1024 µs), as on a
# time-sliced GPU.
#
# Environment: COLOCATE_SECONDS (default 3) is how long each run lasts;
# ARBITER_STUB (default bin/stub) and ARBITER_BIN (default bin/arbiter)
# point at another build, relative to the repository root. The runs use a
# GPU of their own (ARBITER_STUB_NODE), so other stub programs on the
# machine do not disturb the figures.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${COLOCATE_SECONDS:-3}
stub=${ARBITER_STUB:-bin/stub}
arbiter=${ARBITER_BIN:-bin/arbiter}
if ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
	echo "demo-colocate: COLOCATE_SECONDS=\"$secs\": want a whole number of seconds, 1 or more" >&2
	exit 2
fi
for f in "$stub/infer" "$stub/train" "$stub/stubgpu" "$stub/libcuda.so.1"; do
	if [ ! -f "$f" ]; then
		echo "demo-colocate: $f is missing: run 'make build' (or 'make demo', which builds first)" >&2
		exit 1
	fi
done

LC=(--rate 100 --launches 8 --kernel-us 100 --bytes 65536 --sync-every 1 --duration "$secs")
BE=(--kernel-us 1000 --sync-every 1 --duration "$secs")
export ARBITER_STUB_NODE=demo-$$
export LD_LIBRARY_PATH=$stub

workdir=$(mktemp -d /tmp/arbiter-demo-colocate.XXXXXX)
pids=()
# stop_daemon stops the daemon cleanly (it undoes every enforcement) and
# unmounts the bpffs it pinned its gate map on.
daemon=""
stop_daemon() {
	if [ -n "$daemon" ]; then
		kill -TERM "$daemon" 2>/dev/null || true
		wait "$daemon" 2>/dev/null || true
		daemon=""
	fi
	if mountpoint -q "$workdir/bpf" 2>/dev/null; then
		umount "$workdir/bpf" || true
	fi
}

cleanup() {
	local p
	stop_daemon
	for p in "${pids[@]}"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	pids=()
	"$stub/stubgpu" --remove || true
	rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Results per column (alone, shared, arbiter); empty means not measured.
declare -A lc_p50 lc_p99 be_rate
arbiter_note=""

# start NAME PROGRAM ARGS...: runs a workload in the background, its
# stdout (the JSON report) in $workdir/NAME.json, stderr in NAME.err.
start() {
	local name=$1
	shift
	"$@" >"$workdir/$name.json" 2>"$workdir/$name.err" &
	pids+=($!)
}

# finish NAME: waits for the workload started last under NAME; on failure
# shows what it said and exits with its status.
finish() {
	local status=0
	wait "${pids[-1]}" || status=$?
	unset 'pids[-1]'
	if [ "$status" -ne 0 ]; then
		echo "demo-colocate: $1 failed (exit status $status); it said:" >&2
		sed 's/^/  /' "$workdir/$1.err" "$workdir/$1.json" >&2
		exit "$status"
	fi
}

# field FILE KEY: a number from a workload's JSON report.
field() {
	sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" "$1" | tail -n 1
}

measure_alone() {
	start lc-alone "$stub/infer" "${LC[@]}"
	finish lc-alone
	start be-alone "$stub/train" "${BE[@]}"
	finish be-alone
	lc_p50[alone]=$(field "$workdir/lc-alone.json" p50_us)
	lc_p99[alone]=$(field "$workdir/lc-alone.json" p99_us)
	be_rate[alone]=$(field "$workdir/be-alone.json" launches_per_s)
}

measure_side_by_side() {
	start be-shared "$stub/train" "${BE[@]}"
	start lc-shared "$stub/infer" "${LC[@]}"
	finish lc-shared
	finish be-shared
	lc_p50[shared]=$(field "$workdir/lc-shared.json" p50_us)
	lc_p99[shared]=$(field "$workdir/lc-shared.json" p99_us)
	be_rate[shared]=$(field "$workdir/be-shared.json" launches_per_s)
}

# measure_under_arbiter is the third column: the same pair under
# `$arbiter run` with its embedded default policy. LC says it is
# latency-critical (ARBITER_CLASS, as a deployment's environment would);
# BE is best-effort by default. With no NVIDIA driver here the daemon
# enforces with the launch gate: BE is stopped at its next launch while an
# LC request runs (its queued work still drains), and let go in LC's gaps.
# The daemon keeps its state, socket and pinned gate map under $workdir.
measure_under_arbiter() {
	if [ "$(id -u)" -ne 0 ]; then
		arbiter_note="under arbiter run: not measured: the daemon needs root (CAP_BPF, CAP_PERFMON); run make demo as root"
		return
	fi
	if [ ! -x "$arbiter" ]; then
		arbiter_note="under arbiter run: not measured: $arbiter is missing: run 'make build'"
		return
	fi
	mkdir -p "$workdir/state" "$workdir/bpf"
	local sock=$workdir/state/arbiter.sock port=$((20000 + $$ % 20000))
	"$arbiter" run --state-dir "$workdir/state" --socket "$sock" --bpffs "$workdir/bpf" \
		--listen "127.0.0.1:$port" --log-format json >"$workdir/arbiter.log" 2>&1 &
	daemon=$!
	local i
	for i in $(seq 100); do
		"$arbiter" status --socket "$sock" >/dev/null 2>&1 && break
		if ! kill -0 "$daemon" 2>/dev/null; then
			arbiter_note="under arbiter run: the daemon did not start; it said: $(tail -n 2 "$workdir/arbiter.log")"
			daemon=""
			return
		fi
		sleep 0.2
	done
	# The daemon finds the stub library when a process maps it (its
	# rescan, every 2 s): a short warm-up run lets it attach before the
	# measured pair starts.
	start warmup "$stub/infer" --rate 50 --duration 3
	finish warmup
	start be-arbiter "$stub/train" "${BE[@]}"
	start lc-arbiter env ARBITER_CLASS=latency-critical "$stub/infer" "${LC[@]}"
	finish lc-arbiter
	finish be-arbiter
	"$arbiter" status --socket "$sock" >"$workdir/ps.txt" 2>&1 || true
	stop_daemon
	lc_p50[arbiter]=$(field "$workdir/lc-arbiter.json" p50_us)
	lc_p99[arbiter]=$(field "$workdir/lc-arbiter.json" p99_us)
	be_rate[arbiter]=$(field "$workdir/be-arbiter.json" launches_per_s)
	echo "arbiter status after the run:"
	sed 's/^/  /' "$workdir/ps.txt"
}


echo "Each run ${secs}s on a GPU of its own (ARBITER_STUB_NODE=$ARBITER_STUB_NODE):"
echo "  LC: $stub/infer ${LC[*]}"
echo "  BE: $stub/train ${BE[*]}"
measure_alone
measure_side_by_side
measure_under_arbiter

cell() { printf '%s' "${1:-n/a}"; }
printf '\n%-22s %-8s %-14s %s\n' "" "alone" "side by side" "under arbiter run"
for row in p50 p99; do
	declare -n col=lc_$row
	printf '%-22s %-8s %-14s %s\n' "LC $row latency (us)" "$(cell "${col[alone]:-}")" \
		"$(cell "${col[shared]:-}")" "$(cell "${col[arbiter]:-}")"
	unset -n col
done
printf '%-22s %-8s %-14s %s\n' "BE launches/s" "$(cell "${be_rate[alone]:-}")" \
	"$(cell "${be_rate[shared]:-}")" "$(cell "${be_rate[arbiter]:-}")"
awk -v a="${lc_p99[alone]}" -v s="${lc_p99[shared]}" -v ba="${be_rate[alone]}" -v bs="${be_rate[shared]}" 'BEGIN {
	if (a > 0 && ba > 0)
		printf "\nSide by side, LC p99 is %.1f× alone; BE keeps %.0f%% of its throughput.\n", s / a, 100 * bs / ba
}'
awk -v a="${lc_p99[alone]}" -v s="${lc_p99[shared]}" -v r="${lc_p99[arbiter]:-}" -v ba="${be_rate[alone]}" -v br="${be_rate[arbiter]:-}" 'BEGIN {
	if (r > 0 && s > a && ba > 0)
		printf "Under arbiter run, LC p99 is %.1f× alone: %.0f%% of the co-location inflation removed; BE keeps %.0f%% of its throughput.\n", r / a, 100 * (s - r) / (s - a), 100 * br / ba
}'
[ -z "$arbiter_note" ] || echo "($arbiter_note)"
