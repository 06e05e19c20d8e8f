#!/usr/bin/env bash
# The sections of scripts/gpu-validate.sh and their helpers. gpu-validate.sh
# sources this file in each section's own process ("gpu-validate.sh
# __section NAME", run under timeout), with GV_SECTION the section, SEC its
# directory under the results, and the run's settings in GV_* variables;
# section_NAME does the work and appends result lines (see
# internal/gpuvalidate/doc.go) to $GV_WORK/results.txt.

# In a section worker: records for the current section.
check() { emit "CHECK $GV_SECTION $1 $2 ${*:3}"; }
note() { emit "NOTE $GV_SECTION $*"; }

# shown prints a command line with the work and bundle directories named,
# for the report.
shown() {
	local s="$*"
	s=${s//"$GV_WORK"/\$WORK}
	s=${s//"$GV_BUNDLE"/\$BUNDLE}
	printf '%s' "$s"
}

# ran records a command the section runs.
ran() { emit "RUN $GV_SECTION $(shown "$@")"; }

# attach records a file of raw output (a path under $GV_WORK) for the report.
attach() {
	local format=$1 file=$2
	shift 2
	[ -s "$file" ] || return 0
	emit "ATTACH $GV_SECTION $format ${file#"$GV_WORK"/} $*"
}

# step runs a command, logging its label, times, exit status, command line
# and output to the section's command log ($STEPS).
step() {
	local label=$1 t0 t1 rc=0 out
	shift
	t0=$(now_ms)
	out=$("$@" 2>&1) || rc=$?
	t1=$(now_ms)
	printf '@@ %s %s %s %s %s\n' "$label" "$t0" "$t1" "$rc" "$(shown "$@")" >>"$STEPS"
	[ -z "$out" ] || printf '%s\n' "$out" >>"$STEPS"
	return 0
}

# wait_for waits up to $2 seconds for the file $1 to hold a line matching
# the extended regexp $3, while process $4 (if given) lives.
wait_for() {
	local file=$1 secs=$2 re=$3 pid=${4:-} i
	for ((i = 0; i < secs * 10; i++)); do
		grep -Eq "$re" "$file" 2>/dev/null && return 0
		if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
			grep -Eq "$re" "$file" 2>/dev/null && return 0
			return 1
		fi
		sleep 0.1
	done
	return 1
}

# stop_pid interrupts process $1, then kills it if it outlives $2 seconds.
stop_pid() {
	local pid=$1 secs=${2:-10} i
	kill -INT "$pid" 2>/dev/null || return 0
	for ((i = 0; i < secs * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}

# gpureport runs the bundle's report tool, appending its lines to the
# results; its failure becomes a failed check.
gpureport() {
	local err
	if ! err=$("$GV_BUNDLE/gpureport" "$@" 2>&1 >>"$GV_WORK/results.txt"); then
		check report FAIL "gpureport $1 could not read the output: ${err//$'\n'/ / }"
	fi
}

# ---------------------------------------------------------------------------
# Tracing one program from its first instruction: the program waits on a
# fifo until the trace, filtered to its pid, has attached.

# TRACE_EXTRA are further options of arbiter trace for trace_program.
TRACE_EXTRA=()

# trace_program DIR PROGRAM ARGS... traces the program into DIR
# (events.jsonl, trace.log, program.txt) and sets TRACED_PID and
# PROGRAM_RC. It fails if the trace does not attach.
trace_program() {
	local dir=$1 tpid
	shift
	mkdir -p "$dir"
	rm -f "$dir/gate"
	mkfifo -m 600 "$dir/gate"
	(
		read -r _ <"$dir/gate"
		exec "$@"
	) >"$dir/program.txt" 2>&1 &
	TRACED_PID=$!
	ran "$GV_ARBITER" trace --format json --pid "$TRACED_PID" "${TRACE_LIBS[@]}" "${TRACE_EXTRA[@]}" ">" "$(shown "$dir")/events.jsonl"
	ran "$@"
	"$GV_ARBITER" trace --format json --pid "$TRACED_PID" "${TRACE_LIBS[@]}" "${TRACE_EXTRA[@]}" >"$dir/events.jsonl" 2>"$dir/trace.log" &
	tpid=$!
	if ! wait_for "$dir/trace.log" 60 'attached [0-9]+ probe' "$tpid"; then
		check attached FAIL "arbiter trace did not attach: $(tr '\n' ' ' <"$dir/trace.log" | cut -c1-400)"
		kill "$TRACED_PID" 2>/dev/null || true
		stop_pid "$tpid" 5
		PROGRAM_RC=-1
		return 1
	fi
	echo go >"$dir/gate"
	PROGRAM_RC=0
	wait "$TRACED_PID" || PROGRAM_RC=$?
	sleep 0.5 # the trace holds events 20 ms to order them
	stop_pid "$tpid" 15
	attach text "$dir/trace.log" "arbiter trace: standard error (${dir##*/})"
	return 0
}

# ---------------------------------------------------------------------------
# Sections. Each runs in its own process (see run_section) with
# GV_SECTION set and its directory $SEC.

section_build() {
	local nvcc=${NVCC:-nvcc} flags=() name src out rc
	read -ra flags <<<"${NVCC_FLAGS:-}"
	mkdir -p "$GV_WORK/bin"
	for name in capture capture-ptds victim colocate; do
		src=$GV_BUNDLE/src/${name%-ptds}.cu
		out=$GV_WORK/bin/$name
		local extra=()
		[ "$name" != capture-ptds ] || extra=(--default-stream per-thread)
		log "build: $name"
		ran "$nvcc" "${flags[@]}" -O2 "${extra[@]}" -o "$out" "$src"
		rc=0
		"$nvcc" "${flags[@]}" -O2 "${extra[@]}" -o "$out" "$src" >"$SEC/$name.log" 2>&1 || rc=$?
		if [ "$rc" = 0 ]; then
			check "$name" PASS "built"
		else
			check "$name" FAIL "nvcc exit $rc: $(tail -3 "$SEC/$name.log" | tr '\n' ' ')"
			attach text "$SEC/$name.log" "nvcc output for $name"
		fi
	done
}

section_capture_cuda() {
	local prog bench progptds
	if [ -n "${GV_STUB:-}" ]; then
		# infer: 50 requests of a copy in, 4 launches, a copy out, a sync.
		prog=("$GV_STUB/infer" --rate 0 --requests 50 --launches 4 --kernel-us 10 --bytes 4096)
		bench=("$GV_STUB/train" --kernel-us 0 --iterations 20000 --sync-every 256)
	else
		prog=("$GV_WORK/bin/capture" 200)
		progptds=("$GV_WORK/bin/capture-ptds" 50)
		bench=("$GV_WORK/bin/capture" bench 100000)
	fi
	log "capture-cuda: tracing ${prog[0]##*/}"
	if trace_program "$SEC/legacy" "${prog[@]}"; then
		[ -z "${GV_STUB:-}" ] || echo "calls: launches=200 copies=100 htod=50 dtoh=50 syncs=50" >>"$SEC/legacy/program.txt"
		gpureport capture -section "$GV_SECTION" -events "$SEC/legacy/events.jsonl" \
			-log "$SEC/legacy/trace.log" -program "$SEC/legacy/program.txt" -pid "$TRACED_PID" -exit "$PROGRAM_RC"
		attach text "$SEC/legacy/program.txt" "the program's output (legacy)"
	fi
	if [ -n "${progptds:-}" ]; then
		log "capture-cuda: tracing the per-thread default stream build"
		if trace_program "$SEC/ptds" "${progptds[@]}"; then
			gpureport capture -section "$GV_SECTION" -prefix ptds. -events "$SEC/ptds/events.jsonl" \
				-log "$SEC/ptds/trace.log" -program "$SEC/ptds/program.txt" -pid "$TRACED_PID" -exit "$PROGRAM_RC"
			if grep -q '_ptsz\|_ptds' "$SEC/ptds/events.jsonl"; then
				check ptds.forms PASS "per-thread default stream calls captured as $(grep -o '"func":"[A-Za-z_0-9]*_pt[sd][zs]"' "$SEC/ptds/events.jsonl" | sort -u | cut -d'"' -f4 | tr '\n' ' ')"
			else
				check ptds.forms FAIL "no _ptsz or _ptds call captured from the per-thread default stream build"
			fi
		fi
	fi
	log "capture-cuda: probe cost (the launch loop untraced, then traced)"
	ran "${bench[@]}"
	"${bench[@]}" >"$SEC/bench-unprobed.txt" 2>&1 || true
	# Quiet: printing 100,000 events would load the machine the loop runs on.
	TRACE_EXTRA=(--quiet)
	if trace_program "$SEC/bench" "${bench[@]}"; then
		gpureport probecost -section "$GV_SECTION" -unprobed "$SEC/bench-unprobed.txt" -probed "$SEC/bench/program.txt"
	fi
}

section_capture_torch() {
	local prog
	if [ -n "${GV_STUB:-}" ]; then
		prog=("$GV_STUB/train" --kernel-us 50 --iterations 100 --sync-every 10)
	else
		prog=("${PYTHON:-python3}" "$GV_BUNDLE/src/capture_torch.py" 200)
	fi
	log "capture-torch: tracing ${prog[*]##*/}"
	if trace_program "$SEC/run" "${prog[@]}"; then
		[ -z "${GV_STUB:-}" ] || echo "calls: launches=100 syncs=11" >>"$SEC/run/program.txt"
		gpureport capture -section "$GV_SECTION" -events "$SEC/run/events.jsonl" \
			-log "$SEC/run/trace.log" -program "$SEC/run/program.txt" -pid "$TRACED_PID" -exit "$PROGRAM_RC"
		local torch
		torch=$(grep -m1 '^torch:' "$SEC/run/program.txt" || true)
		[ -z "$torch" ] || note "$torch"
		attach text "$SEC/run/program.txt" "the program's output"
	fi
}

section_nvrm() {
	local test=(-test.count=1 -test.v -test.timeout "$((GV_BUDGET > 30 ? GV_BUDGET - 15 : 15))s") rc=0
	local env=(ARBITER_GPU_REPORT="$SEC/nvrm.md")
	if [ -n "${GV_STANDIN:-}" ]; then
		test+=(-test.run '^TestGPUValidateStandin$')
	else
		test+=(-test.run '^TestGPUValidate$')
		env+=(CUDA_VISIBLE_DEVICES="$GV_GPU" ARBITER_GPU_VICTIM="$GV_WORK/bin/victim" ARBITER_GPU_TRIALS="$GV_TRIALS")
		[ -z "${GV_ALLOW_UNVERIFIED:-}" ] || env+=(ARBITER_ALLOW_UNVERIFIED_DRIVER=1)
	fi
	log "nvrm: running nvrm.test ${test[*]}"
	ran env "${env[@]}" "$GV_BUNDLE/nvrm.test" "${test[@]}"
	(cd "$SEC" && env "${env[@]}" "$GV_BUNDLE/nvrm.test" "${test[@]}") >"$SEC/nvrm.log" 2>&1 || rc=$?
	log "nvrm: exit $rc"
	gpureport nvrm -section "$GV_SECTION" -report "$SEC/nvrm.md" -log "$SEC/nvrm.log"
	attach markdown "$SEC/nvrm.md" "nvrm's report"
	attach text "$SEC/nvrm.log" "nvrm.test log"
}

# Channel-control state of a section worker, global so that its EXIT trap
# can undo it: the arbiter channels command line (CH), the pin path, and
# the processes to stop.
CH=()
CH_PIN=""
CH_PIDS=()

# cleanup_channels stops the section's processes and removes its pinned
# tracer.
cleanup_channels() {
	local p
	for p in "${CH_PIDS[@]}"; do
		kill "$p" 2>/dev/null || true
	done
	if [ ${#CH[@]} -gt 0 ]; then
		"${CH[@]}" watch --duration 10ms --pin=false >/dev/null 2>&1 || true
	fi
	[ -z "$CH_PIN" ] || rm -rf "$CH_PIN" 2>/dev/null || true
}

# channels_command sets CH to the arbiter channels command line of this
# section: its own state directory and pin path, and in stand-in mode the
# stand-in control file.
channels_command() {
	local flags=()
	CH_PIN=/sys/fs/bpf/arbiter-validate-$$
	echo "$CH_PIN" >"$SEC/pin-path" # for whoever checks that it is gone
	if [ -n "${GV_STANDIN:-}" ]; then
		[ -e "$SEC/nvidiactl" ] || mknod "$SEC/nvidiactl" c 1 7
		flags=(--control "$SEC/nvidiactl" --control-rdev 1:7 --accept-errno 25 --driver-version 575.51.03)
	fi
	[ -z "${GV_ALLOW_UNVERIFIED:-}" ] || flags+=(--allow-unverified-driver)
	CH=("$GV_ARBITER" channels --state-dir "$SEC/state" --pin-path "$CH_PIN" "${flags[@]}")
	trap cleanup_channels EXIT
}

section_channels() {
	local victim methods m i wpid vpid t0
	STEPS=$SEC/steps.log
	: >"$STEPS"
	channels_command
	if [ -n "${GV_STANDIN:-}" ]; then
		victim=("$GV_STANDIN" "$SEC/nvidiactl" --spin --channels)
	else
		victim=(env CUDA_VISIBLE_DEVICES="$GV_GPU" "$GV_WORK/bin/victim" --monitor)
	fi

	"${CH[@]}" suspend --help >"$SEC/suspend-help.txt" 2>&1 || true
	methods=$("$GV_BUNDLE/gpureport" methods <"$SEC/suspend-help.txt" || true)
	if [ -n "$methods" ]; then
		check methods INFO "arbiter channels suspend --method offers: $(echo "$methods" | tr '\n' ' ')"
	else
		check methods INFO "arbiter channels suspend has no --method: it suspends with GPFIFO_SCHEDULE{0} + PREEMPT only"
	fi

	log "channels: watch, then the victim"
	t0=$(now_ms)
	ran "${CH[@]}" watch --format json "&  # then the victim starts:"
	"${CH[@]}" watch --format json --duration 120s >"$SEC/watch.jsonl" 2>"$SEC/watch.err" &
	wpid=$!
	CH_PIDS+=("$wpid")
	# The victim starts once watch says its tracer is attached (pinned
	# maps appear before that): what a process does on the driver earlier
	# is not recorded. A watch that fails shows its error in the steps.
	wait_for "$SEC/watch.err" 60 '^watching: ' "$wpid" || true
	rm -f "$SEC/victim.in"
	mkfifo -m 600 "$SEC/victim.in"
	ran "${victim[@]}"
	"${victim[@]}" <"$SEC/victim.in" >"$SEC/victim.txt" 2>&1 &
	vpid=$!
	CH_PIDS+=("$vpid")
	# Read-write: opening never blocks, and writing never meets a closed
	# pipe, whatever became of the victim.
	exec 8<>"$SEC/victim.in"
	if ! wait_for "$SEC/victim.txt" 60 '^ready' "$vpid"; then
		check victim FAIL "the victim did not start: $(tr '\n' ' ' <"$SEC/victim.txt" | cut -c1-400)"
		stop_pid "$wpid" 10
		return 0
	fi
	sleep 1
	stop_pid "$wpid" 15
	{
		printf '@@ watch %s %s 0 %s\n' "$t0" "$(now_ms)" "$(shown "${CH[@]}") watch --format json"
		cat "$SEC/watch.jsonl" "$SEC/watch.err"
	} >>"$STEPS"

	log "channels: list, timeslice, interleave"
	ran "${CH[@]}" list --format json
	step list "${CH[@]}" list --format json
	ran "${CH[@]}" timeslice "$vpid" 200
	step timeslice "${CH[@]}" timeslice "$vpid" 200
	for m in low high medium; do
		ran "${CH[@]}" interleave "$vpid" "$m"
		step "interleave.$m" "${CH[@]}" interleave "$vpid" "$m"
	done
	for m in ${methods:-default}; do
		local mflag=()
		[ "$m" = default ] || mflag=(--method "$m")
		log "channels: $GV_CLI_TRIALS suspensions, method $m"
		ran "${CH[@]}" suspend "$vpid" --for 100ms "${mflag[@]}" "  # $GV_CLI_TRIALS times, 100 ms apart"
		for ((i = 1; i <= GV_CLI_TRIALS; i++)); do
			step "suspend.$m.$i" "${CH[@]}" suspend "$vpid" --for 100ms "${mflag[@]}"
			sleep 0.1
		done
	done
	ran "${CH[@]}" resume "$vpid"
	step resume "${CH[@]}" resume "$vpid"
	step list "${CH[@]}" list --format json
	echo stop >&8
	exec 8>&-
	for ((i = 0; i < 600; i++)); do
		kill -0 "$vpid" 2>/dev/null || break
		sleep 0.1
	done
	kill "$vpid" 2>/dev/null || true
	wait "$vpid" 2>/dev/null || true
	gpureport channels -section "$GV_SECTION" -steps "$STEPS" -victim "$SEC/victim.txt" -pid "$vpid"
	attach text "$STEPS" "the commands and their output"
	attach text "$SEC/victim.txt" "the victim's output"
}

# start_workload NAME PROGRAM ARGS... starts a co-location workload, its
# output in $SEC/NAME.txt and, with --wait among ARGS, its stdin on the
# fifo $SEC/NAME.in; sets STARTED_PID, the workload's own pid (the one
# arbiter channels controls), and it ends by its --duration or with the
# section.
start_workload() {
	local name=$1
	shift
	ran "$@"
	if [[ " $* " == *" --wait "* ]]; then
		rm -f "$SEC/$name.in"
		mkfifo -m 600 "$SEC/$name.in"
		"$@" <"$SEC/$name.in" >"$SEC/$name.txt" 2>&1 &
	else
		"$@" >"$SEC/$name.txt" 2>&1 &
	fi
	STARTED_PID=$!
	CH_PIDS+=("$STARTED_PID")
}

# suspend_started X PID FOR starts arbiter channels suspend PID --for FOR
# in the background and waits until the process is suspended;
# suspend_finished waits for the command and logs it as step does.
SUSPEND_PID=""
suspend_started() {
	local x=$1 pid=$2 for=$3
	SUSPEND_CMD=("${CH[@]}" suspend "$pid" --for "$for")
	SUSPEND_OUT=$x.suspend.out
	SUSPEND_T0=$(now_ms)
	"${SUSPEND_CMD[@]}" >"$SUSPEND_OUT" 2>&1 &
	SUSPEND_PID=$!
	wait_for "$SUSPEND_OUT" 10 'suspended' "$SUSPEND_PID" || true
}
suspend_finished() {
	local rc=0
	wait "$SUSPEND_PID" || rc=$?
	printf '@@ suspend.be %s %s %s %s\n' "$SUSPEND_T0" "$(now_ms)" "$rc" "$(shown "${SUSPEND_CMD[@]}")" >>"$STEPS"
	cat "$SUSPEND_OUT" >>"$STEPS"
	rm -f "$SUSPEND_OUT"
	SUSPEND_PID=""
}

# colocate_scenario runs one scenario, writing its files with prefix $1
# (see gpuvalidate.LoadScenarios).
colocate_scenario() {
	local x=$1 name=$2 lpid="" bpid="" d=$GV_COLOCATE_SECONDS
	STEPS=$x.steps
	if [ "$name" != lc-alone ]; then
		start_workload be "${BE[@]}" "${GATE[@]}"
		bpid=$STARTED_PID
		[ ${#GATE[@]} = 0 ] || exec 7<>"$SEC/be.in"
	fi
	if [ "$name" != be-alone ]; then
		start_workload lc "${LC[@]}" "${GATE[@]}"
		lpid=$STARTED_PID
		[ ${#GATE[@]} = 0 ] || exec 6<>"$SEC/lc.in"
	fi
	if [ ${#GATE[@]} -gt 0 ]; then
		if { [ -n "$bpid" ] && ! wait_for "$SEC/be.txt" 60 '^ready' "$bpid"; } ||
			{ [ -n "$lpid" ] && ! wait_for "$SEC/lc.txt" 60 '^ready' "$lpid"; }; then
			echo "a workload did not start: $(cat "$SEC/be.txt" "$SEC/lc.txt" 2>/dev/null | tr '\n' ' ' | cut -c1-300)" >"$x.skip"
			kill "$bpid" "$lpid" 2>/dev/null || true
			wait 2>/dev/null || true
			exec 6>&- 7>&-
			return 0
		fi
		case $name in
		timeslice)
			step timeslice.be "${CH[@]}" timeslice "$bpid" 100
			step timeslice.lc "${CH[@]}" timeslice "$lpid" 10000
			;;
		interleave)
			step interleave.be "${CH[@]}" interleave "$bpid" low
			step interleave.lc "${CH[@]}" interleave "$lpid" high
			;;
		esac
		[ -z "$bpid" ] || echo go >&7
		if [ "$name" = suspend-be ]; then
			# The BE runs with work queued, then is held before the LC
			# starts, so that the LC's whole run is measured with the BE
			# suspended (and its queued work stopped with it).
			sleep 0.5
			suspend_started "$x" "$bpid" "$((d + 2))s"
		fi
		[ -z "$lpid" ] || echo go >&6
	fi
	[ -z "$lpid" ] || wait "$lpid" || true
	[ -z "$SUSPEND_PID" ] || suspend_finished
	[ -z "$bpid" ] || wait "$bpid" || true
	exec 6>&- 7>&-
	[ -z "$lpid" ] || cp "$SEC/lc.txt" "$x.lc.txt"
	[ -z "$bpid" ] || cp "$SEC/be.txt" "$x.be.txt"
}

section_colocate() {
	local dir=$SEC/scenarios d=$GV_COLOCATE_SECONDS n=0 name x
	mkdir -p "$dir"
	channels_command
	if [ -n "${GV_STUB:-}" ]; then
		LC=("$GV_STUB/infer" --rate 200 --launches 4 --kernel-us 100 --bytes 1048576 --duration "$d")
		BE=("$GV_STUB/train" --kernel-us 5000 --sync-every 4 --duration "$d")
		GATE=()
	else
		LC=(env CUDA_VISIBLE_DEVICES="$GV_GPU" "$GV_WORK/bin/colocate" lc --rate 200 --launches 4 --kernel-us 100 --bytes 1048576 --duration "$d")
		BE=(env CUDA_VISIBLE_DEVICES="$GV_GPU" "$GV_WORK/bin/colocate" be --kernel-us 10000 --sync-every 4 --duration "$d")
		GATE=(--wait)
		# Pin the RM tracer so that the workloads' handles are recorded.
		ran "${CH[@]}" watch --duration 2s
		"${CH[@]}" watch --duration 2s >"$SEC/watch.txt" 2>&1 || true
	fi
	for name in lc-alone be-alone default timeslice interleave suspend-be; do
		n=$((n + 1))
		x=$dir/$(printf '%02d' "$n")-$name
		case $name in
		lc-alone) echo "LC alone" ;;
		be-alone) echo "BE alone" ;;
		default) echo "side by side, the driver's defaults" ;;
		timeslice) echo "BE timeslice 100 µs, LC 10000 µs (arbiter channels timeslice)" ;;
		interleave) echo "BE interleave low, LC high (arbiter channels interleave)" ;;
		suspend-be) echo "BE suspended from before the LC's start to after its end (arbiter channels suspend --for $((d + 2))s)" ;;
		esac >"$x.what"
		case $name in timeslice | interleave | suspend-be)
			if [ -n "${GV_STUB:-}" ]; then
				echo "the stub driver has no channel groups to control" >"$x.skip"
				continue
			fi
			;;
		esac
		log "colocate: $name (${d}s)"
		colocate_scenario "$x" "$name"
	done
	gpureport colocate -section "$GV_SECTION" -dir "$dir"
}

# ---------------------------------------------------------------------------
# The daemon: arbiter run enforcing a policy on an LC and a BE workload, at
# each enforcement level, against the two alone and side by side without it.

# Daemon state of the section worker, global so that its EXIT trap can stop
# it: the daemon's pid, its BPF filesystem mount, the workloads.
DM_PID=""
DM_BPF=""
DM_PIDS=()

# cleanup_daemon stops the workloads and the daemon (which undoes every
# hold it made on the way out) and unmounts its BPF filesystem.
cleanup_daemon() {
	local p
	for p in "${DM_PIDS[@]}"; do
		kill -INT "$p" 2>/dev/null || true
	done
	[ -z "$DM_PID" ] || stop_daemon_run
	for p in "${DM_PIDS[@]}"; do
		stop_pid "$p" 5
	done
	if [ -n "$DM_BPF" ] && mountpoint -q "$DM_BPF" 2>/dev/null; then
		umount "$DM_BPF" 2>/dev/null || true
	fi
}

# daemon_policy DIR LEVEL writes a policy for this section's own two
# workloads, told apart by ARBITER_VALIDATE_CLASS: the LC latency-critical,
# the BE best-effort, both at enforcement level LEVEL (observe: both only
# observed; otherwise the LC with its class's long timeslice and the BE
# with mode LEVEL). Every other CUDA process on the server is only
# observed: the validation holds nothing of anyone else's.
daemon_policy() {
	local dir=$1 level=$2 lc='lib.classes["latency-critical"]'
	mkdir -p "$dir"
	[ "$level" != observe ] || lc='object.union(lib.classes["latency-critical"], {"preemption": {"mode": "observe"}})'
	cat >"$dir/policy.rego" <<REGO
# Written by gpu-validate.sh's daemon section: BE at level $level.
package arbiter

import data.arbiter.lib

default_decision := {"class": "bystander", "preemption": {"mode": "observe"}, "reason": "not this validation's"}

classify := lib.with_reason($lc, "ARBITER_VALIDATE_CLASS") if {
	lib.env("ARBITER_VALIDATE_CLASS") == "latency-critical"
} else := lib.with_reason(object.union(lib.classes["best-effort"], {"preemption": {"mode": "$level"}}), "best-effort at $level") if {
	lib.env("ARBITER_VALIDATE_CLASS") == "best-effort"
} else := default_decision

victims := lib.default_victims
REGO
}

# start_daemon_run LEVEL starts arbiter run with the policy of LEVEL and
# waits until it answers on its socket; false (with the reason in
# DM_WHY) where it does not.
start_daemon_run() {
	local level=$1 i
	DM_SOCK=$SEC/run-$level/arbiter.sock
	DM_LOG=$SEC/run-$level/arbiter.log
	mkdir -p "$SEC/run-$level/state" "$DM_BPF"
	daemon_policy "$SEC/run-$level/policy" "$level"
	local cmd=("$GV_ARBITER" run --policy "$SEC/run-$level/policy" --state-dir "$SEC/run-$level/state"
		--socket "$DM_SOCK" --bpffs "$DM_BPF" --listen "127.0.0.1:$((20000 + RANDOM % 20000))" --log-format json)
	[ -z "${GV_ALLOW_UNVERIFIED:-}" ] || cmd+=(--allow-unverified-driver)
	ran "${cmd[@]}"
	"${cmd[@]}" >"$DM_LOG" 2>&1 &
	DM_PID=$!
	for ((i = 0; i < 600; i++)); do
		"$GV_ARBITER" status --socket "$DM_SOCK" >/dev/null 2>&1 && return 0
		if ! kill -0 "$DM_PID" 2>/dev/null; then
			wait "$DM_PID" 2>/dev/null || true
			DM_PID=""
			DM_WHY="arbiter run exited at start: $(tail -n 3 "$DM_LOG" | tr '\n' ' ' | cut -c1-400)"
			return 1
		fi
		sleep 0.1
	done
	DM_WHY="arbiter run did not answer on $DM_SOCK within 60 s"
	stop_daemon_run
	return 1
}

# stop_daemon_run stops the daemon with SIGTERM, as systemd does, and sets
# DM_EXIT to its exit status.
stop_daemon_run() {
	local i
	DM_EXIT=""
	[ -n "$DM_PID" ] || return 0
	kill -TERM "$DM_PID" 2>/dev/null || true
	for ((i = 0; i < 300; i++)); do
		kill -0 "$DM_PID" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$DM_PID" 2>/dev/null; then
		kill -KILL "$DM_PID" 2>/dev/null || true
		DM_EXIT=killed
	fi
	local rc=0
	wait "$DM_PID" 2>/dev/null || rc=$?
	[ -n "$DM_EXIT" ] || DM_EXIT=$rc
	DM_PID=""
}

# daemon_scenario X NAME LEVEL runs one scenario (LEVEL empty: no daemon),
# writing its files with prefix X as the co-location section does.
daemon_scenario() {
	local x=$1 name=$2 level=$3 lpid="" bpid=""
	if [ -n "$level" ] && ! start_daemon_run "$level"; then
		echo "$DM_WHY" >"$x.skip"
		check "daemon.$name" FAIL "$DM_WHY"
		return 0
	fi
	if [ "$name" != lc-alone ]; then
		ran "${BE[@]}"
		"${BE[@]}" >"$SEC/be.txt" 2>&1 &
		bpid=$!
		DM_PIDS+=("$bpid")
		if [ -z "${GV_STUB:-}" ] && ! wait_for "$SEC/be.txt" 180 '^ready' "$bpid"; then
			echo "the BE did not start: $(tr '\n' ' ' <"$SEC/be.txt" | cut -c1-300)" >"$x.skip"
			cleanup_daemon
			DM_PIDS=()
			return 0
		fi
	fi
	if [ "$name" != be-alone ]; then
		ran "${LC[@]}"
		"${LC[@]}" >"$SEC/lc.txt" 2>&1 &
		lpid=$!
		DM_PIDS+=("$lpid")
		if [ -n "$level" ]; then
			# While both run: what the daemon made of them (the stub's
			# infer prints no "ready": it is ready at once).
			if [ -n "${GV_STUB:-}" ] || wait_for "$SEC/lc.txt" 180 '^ready' "$lpid"; then
				sleep 1
				"$GV_ARBITER" ps --socket "$DM_SOCK" >"$x.ps.txt" 2>&1 || true
			fi
		fi
		wait "$lpid" || true
		cp "$SEC/lc.txt" "$x.lc.txt"
	fi
	if [ -n "$bpid" ]; then
		# The BE trains on until the LC is done (alone: its own duration).
		[ "$name" = be-alone ] || kill -INT "$bpid" 2>/dev/null || true
		wait "$bpid" || true
		cp "$SEC/be.txt" "$x.be.txt"
	fi
	DM_PIDS=()
	[ -n "$level" ] || return 0
	"$GV_ARBITER" status --socket "$DM_SOCK" >"$x.status.txt" 2>&1 || true
	stop_daemon_run
	daemon_checks "$x" "$name" "$level"
	attach text "$x.ps.txt" "arbiter ps while both ran ($name)"
	attach text "$x.status.txt" "arbiter status after the run ($name)"
}

# daemon_checks records what the daemon did in one scenario: the classes
# it gave, the holds it made (from arbiter status's engine line), and its
# clean exit; and appends the engine's counts to the scenario's text.
daemon_checks() {
	local x=$1 name=$2 level=$3 engine suspends gates errors ok=PASS why=()
	engine=$(grep -m1 '^engine:' "$x.status.txt" || true)
	[ -z "$engine" ] || echo "arbiter $engine" >>"$x.what"
	suspends=$(sed -n 's/.* \([0-9]*\) suspends.*/\1/p' <<<"$engine")
	gates=$(sed -n 's/.* \([0-9]*\) gates.*/\1/p' <<<"$engine")
	errors=$(sed -n 's/.* \([0-9]*\) enforcement errors.*/\1/p' <<<"$engine")
	if ! grep -q 'latency-critical' "$x.ps.txt" 2>/dev/null || ! grep -q 'best-effort' "$x.ps.txt" 2>/dev/null; then
		ok=FAIL
		why+=("arbiter ps did not show one latency-critical and one best-effort process")
	fi
	if [ -z "$engine" ]; then
		ok=FAIL
		why+=("arbiter status printed no engine line: $(tr '\n' ' ' <"$x.status.txt" | cut -c1-200)")
	else
		[ "${errors:-0}" = 0 ] || {
			ok=FAIL
			why+=("$errors enforcement errors")
		}
		case $level in
		suspend)
			# The stub driver has no channel groups: the daemon falls
			# back to the gate there.
			if [ -n "${GV_STUB:-}" ] && [ "${gates:-0}" -gt 0 ]; then
				:
			elif [ "${suspends:-0}" -eq 0 ]; then
				ok=FAIL
				why+=("no suspension at level suspend")
			fi
			;;
		gate) [ "${gates:-0}" -gt 0 ] || {
			ok=FAIL
			why+=("no gate at level gate")
		} ;;
		observe) [ "${suspends:-0}${gates:-0}" = 00 ] || {
			ok=FAIL
			why+=("held processes at level observe ($suspends suspends, $gates gates)")
		} ;;
		esac
	fi
	[ "$DM_EXIT" = 0 ] || {
		ok=FAIL
		why+=("arbiter run exited with status $DM_EXIT on SIGTERM")
	}
	if grep -q '"level":"error"' "$DM_LOG"; then
		why+=("its log has errors: $(grep -m2 '"level":"error"' "$DM_LOG" | cut -c1-300 | tr '\n' ' ')")
		ok=FAIL
	fi
	if [ "$ok" = PASS ]; then
		check "daemon.$name" PASS "classified both; ${engine#engine: }; exited 0 on SIGTERM"
	else
		check "daemon.$name" FAIL "$(
			IFS=';'
			echo "${why[*]}"
		); ${engine:-no engine line}"
	fi
	attach text "$DM_LOG" "arbiter run's log ($name)"
}

section_daemon() {
	local dir=$SEC/scenarios d=$GV_COLOCATE_SECONDS n=0 name x level
	mkdir -p "$dir"
	DM_BPF=$SEC/bpf
	DM_DIR=$dir
	trap daemon_exit EXIT
	if [ -n "${GV_STUB:-}" ]; then
		LC=(env ARBITER_VALIDATE_CLASS=latency-critical "$GV_STUB/infer" --rate 100 --launches 8 --kernel-us 100 --bytes 65536 --sync-every 1 --duration "$d")
		BE=(env ARBITER_VALIDATE_CLASS=best-effort "$GV_STUB/train" --kernel-us 1000 --sync-every 1 --duration "$((d + 30))")
	else
		LC=(env CUDA_VISIBLE_DEVICES="$GV_GPU" ARBITER_VALIDATE_CLASS=latency-critical "${PYTHON:-python3}" "$GV_BUNDLE/src/serve_torch.py" --rate 100 --duration "$d")
		BE=(env CUDA_VISIBLE_DEVICES="$GV_GPU" ARBITER_VALIDATE_CLASS=best-effort "${PYTHON:-python3}" "$GV_BUNDLE/src/train_torch.py" --duration "$((d + 60))")
	fi
	for name in lc-alone be-alone default observe timeslice suspend gate; do
		n=$((n + 1))
		x=$dir/$(printf '%02d' "$n")-$name
		level=""
		case $name in
		lc-alone) echo "LC alone" ;;
		be-alone) echo "BE alone" ;;
		default) echo "side by side, no arbiter, the driver's defaults" ;;
		*)
			level=$name
			echo "side by side under arbiter run, BE at level $level"
			;;
		esac >"$x.what"
		log "daemon: $name"
		local sbe=("${BE[@]}")
		# Alone, the BE trains for the LC's duration.
		[ "$name" != be-alone ] || BE[-1]=$d
		DM_CURRENT=$x
		daemon_scenario "$x" "$name" "$level"
		DM_CURRENT=""
		BE=("${sbe[@]}")
	done
}

# daemon_exit ends the section however it ends: the daemon and workloads
# stopped, a scenario cut short by the time budget marked as such, and the
# scenarios that ran reported.
DM_CURRENT=""
DM_DIR=""
daemon_exit() {
	cleanup_daemon
	if [ -n "$DM_CURRENT" ]; then
		echo "stopped: the section ran out of its time budget during this scenario (--budget daemon=SECONDS, --limit)" >"$DM_CURRENT.skip"
	fi
	[ -z "$DM_DIR" ] || gpureport colocate -section "$GV_SECTION" -dir "$DM_DIR"
}
