#!/usr/bin/env bash
# Validate Arbiter on a real NVIDIA GPU server, in at most 25 minutes, and
# write the results as Markdown ready for docs/gpu-validation.md.
#
# It runs prebuilt binaries: build the bundle on a development machine
# (`make gpu-validate-bundle`: arbiter, nvrm.test, gpureport, this script
# and the CUDA/PyTorch sources in bin/gpu-validate, also packed as
# bin/gpu-validate.tar.gz), copy it to the server and run, as root:
#
#   sudo ./gpu-validate.sh --out gpu-validation.md
#
# The server needs the NVIDIA driver, nvidia-smi, nvcc (the CUDA programs
# are compiled there) and, for the PyTorch check, python3 with torch; not
# Go. A missing piece makes the sections that need it SKIPPED, with the
# reason in the report; the others still run.
#
# Sections, each in its own process under its own time budget (timeout),
# all within the overall limit:
#   build          compile the CUDA programs with nvcc
#   capture-cuda   arbiter trace of a CUDA C program (legacy and per-thread
#                  default stream): every launch, copy and sync it makes must
#                  be captured; probe cost per launch
#   capture-torch  arbiter trace of a PyTorch inference loop
#   nvrm           nvrm's TestGPUValidate: the RM allocation sequence, every
#                  channel control, suspend/resume latency over --trials
#                  trials, disable-only and preempt-only, work after resume
#   channels       the arbiter channels commands on a victim: watch, list,
#                  timeslice, interleave, suspend --for per suspend method
#                  (--cli-trials each) with the victim reporting its stalls
#   colocate       an LC and a BE workload alone, side by side with the
#                  driver's defaults, and under timeslice, interleave and
#                  suspension applied with arbiter channels
#   daemon         arbiter run with a PyTorch inference loop (LC) and a
#                  PyTorch training loop (BE): alone, side by side without
#                  it, and under it at each enforcement level
#
# Results: a directory (--results, default ./gpu-validate-DATE) holding
# results.txt, one line per finding (the format is in
# internal/gpuvalidate/doc.go), and each section's raw output; the report is
# rendered from it by gpureport, to --out or standard output. Progress goes
# to standard error.
#
# The sections themselves are in gpu-validate-sections.sh beside this file.
# Tests run the same sections on the stub CUDA driver (--stub DIR: the
# capture and co-location sections use its infer and train) and the
# stand-in control file (--standin RMSTANDIN: the nvrm and channels
# sections); see internal/gpuvalidate/script_test.go.
set -euo pipefail

SELF=$(readlink -f "$0")

usage() {
	cat <<'EOF'
usage: gpu-validate.sh [options]
  --bundle DIR             the prebuilt binaries (default: this script's directory)
  --out FILE               write the Markdown report here (default: standard output)
  --results DIR            keep results and raw output here (default: ./gpu-validate-DATE)
  --sections LIST          comma-separated subset of: build,capture-cuda,capture-torch,nvrm,channels,colocate,daemon
  --gpu N                  the GPU to run on (CUDA_VISIBLE_DEVICES; default 0)
  --trials N               suspend/resume trials of the nvrm procedure (default 100)
  --cli-trials N           suspend --for trials per method from the command line (default 20)
  --colocate-seconds N     length of each co-location run (default 15)
  --limit SECONDS          overall time limit (default 1500: 25 minutes)
  --budget SECTION=SECONDS a section's own time limit (repeatable; defaults: build 180,
                           capture-cuda 150, capture-torch 200, nvrm 400, channels 200, colocate 240,
                           daemon 420)
  --allow-unverified-driver  validate a driver newer than the newest Arbiter verified
  --stub DIR               test mode: capture and co-location on the stub driver in DIR
  --standin RMSTANDIN      test mode: nvrm and channels on the RM stand-in program
Environment: NVCC (default nvcc), NVCC_FLAGS (e.g. "-ccbin g++-12"), PYTHON (default python3).
EOF
}

# now_ms prints wall-clock milliseconds since the epoch.
now_ms() { date +%s%3N; }

# log prints a progress line on stderr.
log() { printf '[%4ds] gpu-validate: %s\n' "$(($(date +%s) - ${GV_EPOCH:-0}))" "$*" >&2; }

# emit appends one record to the results file.
emit() { printf '%s\n' "$*" >>"$GV_WORK/results.txt"; }

# ---------------------------------------------------------------------------
# Preflight: why a section cannot run here, or nothing.

why_skip() {
	local name=$1
	if [ "$(id -u)" != 0 ]; then
		echo "needs root (eBPF, pidfd_getfd of another process): run with sudo"
		return
	fi
	if [ "$name" = build ] && [ -n "${GV_STUB:-}${GV_STANDIN:-}" ]; then
		echo "test mode: the stub driver's and the stand-in's programs are prebuilt"
		return
	fi
	local real_driver=yes
	case $name in
	capture-cuda | capture-torch | colocate | daemon) [ -z "${GV_STUB:-}" ] || real_driver= ;;
	nvrm | channels) [ -z "${GV_STANDIN:-}" ] || real_driver= ;;
	esac
	if [ -n "$real_driver" ] && [ ! -e /dev/nvidiactl ]; then
		echo "no NVIDIA driver: /dev/nvidiactl does not exist (is the nvidia module loaded? nvidia-smi should work)"
		return
	fi
	case $name in
	build)
		if ! command -v "${NVCC:-nvcc}" >/dev/null; then
			echo "nvcc not found: install the CUDA toolkit, put its bin on PATH, or set NVCC=/path/to/nvcc"
		fi
		;;
	capture-cuda | colocate)
		if [ -n "${GV_STUB:-}" ]; then
			[ -x "$GV_STUB/infer" ] || echo "no stub workloads in $GV_STUB"
		else
			local built=capture
			[ "$name" != colocate ] || built=colocate
			[ -x "$GV_WORK/bin/$built" ] || echo "the $built program was not built (see Build)"
		fi
		;;
	capture-torch | daemon)
		if [ -n "${GV_STUB:-}" ]; then
			[ -x "$GV_STUB/train" ] || echo "no stub workloads in $GV_STUB"
		elif ! command -v "${PYTHON:-python3}" >/dev/null; then
			echo "python3 not found (set PYTHON=/path/to/python with torch installed)"
		else
			local err
			if ! err=$(timeout 120 "${PYTHON:-python3}" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "torch " + torch.__version__ + " sees no usable GPU (CUDA " + str(torch.version.cuda) + ")")' 2>&1); then
				echo "PyTorch unusable: $(echo "$err" | tail -1) (pip install torch, or set PYTHON to an interpreter that has it)"
			fi
		fi
		;;
	nvrm)
		[ -x "$GV_BUNDLE/nvrm.test" ] || echo "no nvrm.test in the bundle $GV_BUNDLE (rebuild it with make gpu-validate-bundle)"
		if [ -n "${GV_STANDIN:-}" ]; then
			command -v gcc >/dev/null || echo "gcc not found: the stand-in procedure compiles its program at run time"
		elif [ ! -x "$GV_WORK/bin/victim" ]; then
			echo "the victim was not built (see Build)"
		fi
		;;
	channels)
		if [ -n "${GV_STANDIN:-}" ]; then
			[ -x "$GV_STANDIN" ] || echo "no stand-in program at $GV_STANDIN"
		elif [ ! -x "$GV_WORK/bin/victim" ]; then
			echo "the victim was not built (see Build)"
		fi
		;;
	esac
}

# budget_of prints a section's time budget in seconds: from --budget,
# else its default.
budget_of() {
	local b
	for b in $GV_BUDGETS; do
		if [ "${b%%=*}" = "$1" ]; then
			echo "${b#*=}"
			return
		fi
	done
	case $1 in
	build) echo 180 ;;
	capture-cuda) echo 150 ;;
	capture-torch) echo 200 ;;
	nvrm) echo 400 ;;
	channels) echo 200 ;;
	colocate) echo 240 ;;
	daemon) echo 420 ;;
	*) echo 60 ;;
	esac
}

# run_section runs one section in its own process under its budget, or
# records why it is skipped, and records how it ended.
run_section() {
	local name=$1 why budget left t0 rc=0
	why=$(why_skip "$name")
	left=$((GV_LIMIT - (SECONDS - GV_T0) - 30))
	if [ -z "$why" ] && [ "$left" -lt 20 ]; then
		why="the overall limit of $GV_LIMIT s was reached before this section"
	fi
	if [ -n "$why" ]; then
		log "$name: SKIPPED: $why"
		emit "SECTION $name SKIP 0 $why"
		return
	fi
	budget=$(budget_of "$name")
	[ "$budget" -le "$left" ] || budget=$left
	log "$name: start (budget ${budget}s)"
	mkdir -p "$GV_WORK/$name"
	t0=$SECONDS
	# In the background, so that an interrupt reaches the trap below,
	# which stops the section: timeout runs it in a process group of its
	# own, which the terminal's Ctrl-C does not reach.
	GV_BUDGET=$budget timeout -k 10 "$budget" bash "$SELF" __section "$name" &
	SECTION_PID=$!
	wait "$SECTION_PID" || rc=$?
	SECTION_PID=
	case $rc in
	0) emit "SECTION $name DONE $((SECONDS - t0))" ;;
	124 | 137) emit "SECTION $name TIMEOUT $((SECONDS - t0)) ran past its budget of $budget s and was stopped" ;;
	*) emit "SECTION $name ERROR $((SECONDS - t0)) the section stopped with exit status $rc (its output is above in the log)" ;;
	esac
	log "$name: done in $((SECONDS - t0))s (exit $rc)"
}

# record_machine writes the META records.
record_machine() {
	local smi="timeout 30 nvidia-smi" v
	emit "META date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	emit "META host $(uname -n)"
	emit "META kernel $(uname -r) $(uname -m)"
	v=$(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null || true)
	[ -z "$v" ] || emit "META os $v"
	if [ -r /sys/module/nvidia/version ]; then
		emit "META driver $(cat /sys/module/nvidia/version)"
	elif [ -r /proc/driver/nvidia/version ]; then
		emit "META driver $(head -1 /proc/driver/nvidia/version)"
	else
		emit "META driver none loaded"
	fi
	if command -v nvidia-smi >/dev/null; then
		local i=0 line
		while IFS= read -r line; do
			emit "META gpu.$i $line"
			i=$((i + 1))
		done < <($smi --query-gpu=name,pci.bus_id,memory.total,compute_mode,mig.mode.current,persistence_mode,vbios_version --format=csv,noheader 2>/dev/null || true)
		emit "META gpu_used $GV_GPU"
		v=$($smi -q -i "$GV_GPU" 2>/dev/null | awk -F': *' '/GSP Firmware Version/ {print $2; exit}' || true)
		emit "META gsp ${v:-not reported}"
		v=$($smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -1 || true)
		[ -z "$v" ] || emit "META cuda_driver ${v#CUDA Version: }"
		v=$($smi compute-policy -l 2>/dev/null | tr -s ' \n' ' ' || true)
		[ -z "$v" ] || emit "META compute_policy $v"
	else
		emit "META gpu nvidia-smi not found"
	fi
	if pgrep -x nvidia-cuda-mps-control >/dev/null 2>&1; then emit "META mps running"; fi
	if command -v "${NVCC:-nvcc}" >/dev/null; then
		emit "META nvcc $("${NVCC:-nvcc}" --version | grep -o 'release [0-9.]*, V[0-9.]*' || echo unknown)"
	else
		emit "META nvcc not found"
	fi
	if command -v "${PYTHON:-python3}" >/dev/null; then
		v=$(timeout 120 "${PYTHON:-python3}" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo "not importable")
		emit "META torch $v"
	fi
	emit "META arbiter $("$GV_ARBITER" version 2>/dev/null | head -1 || echo unknown)"
	if [ -n "${GV_STUB:-}${GV_STANDIN:-}" ]; then
		emit "META mode test: ${GV_STUB:+stub CUDA driver}${GV_STUB:+${GV_STANDIN:+ and }}${GV_STANDIN:+RM stand-in}"
	else
		emit "META mode hardware"
	fi
	emit "META procedure scripts/gpu-validate.sh $GV_ARGS (GPU $GV_GPU, $GV_TRIALS trials, $GV_CLI_TRIALS command-line trials per method, ${GV_COLOCATE_SECONDS}s per co-location run, limit $GV_LIMIT s)"
}

# interrupted stops the running section (timeout passes the signal to its
# process group, whose traps resume and unpin what they changed) and ends
# the run.
interrupted() {
	if [ -n "${SECTION_PID:-}" ]; then
		kill -TERM "$SECTION_PID" 2>/dev/null || true
		wait "$SECTION_PID" 2>/dev/null || true
	fi
	log "interrupted: partial results in $GV_WORK (render them with: $GV_BUNDLE/gpureport render $GV_WORK)"
	exit 130
}

main() {
	local out="" results="" sections=build,capture-cuda,capture-torch,nvrm,channels,colocate,daemon
	export GV_GPU=0 GV_TRIALS=100 GV_CLI_TRIALS=20 GV_COLOCATE_SECONDS=15 GV_LIMIT=1500
	export GV_BUNDLE="" GV_STUB="" GV_STANDIN="" GV_BUDGETS="" GV_ARGS="$*"
	# The variable nvrm's procedure reads, honoured here too.
	export GV_ALLOW_UNVERIFIED=${ARBITER_ALLOW_UNVERIFIED_DRIVER:-}
	while [ $# -gt 0 ]; do
		case $1 in
		--bundle | --out | --results | --sections | --gpu | --trials | --cli-trials | --colocate-seconds | --limit | --budget | --stub | --standin)
			if [ $# -lt 2 ]; then
				echo "gpu-validate: $1 needs a value (see --help)" >&2
				return 2
			fi
			;;
		esac
		case $1 in
		--bundle) GV_BUNDLE=$2 ;;
		--out) out=$2 ;;
		--results) results=$2 ;;
		--sections) sections=$2 ;;
		--gpu) GV_GPU=$2 ;;
		--trials) GV_TRIALS=$2 ;;
		--cli-trials) GV_CLI_TRIALS=$2 ;;
		--colocate-seconds) GV_COLOCATE_SECONDS=$2 ;;
		--limit) GV_LIMIT=$2 ;;
		--budget)
			if ! [[ $2 =~ ^[a-z-]+=[0-9]+$ ]]; then
				echo "gpu-validate: --budget $2: want SECTION=SECONDS, e.g. nvrm=600" >&2
				return 2
			fi
			GV_BUDGETS="$GV_BUDGETS $2"
			;;
		--stub) GV_STUB=$(readlink -f "$2") ;;
		--standin) GV_STANDIN=$(readlink -f "$2") ;;
		--allow-unverified-driver)
			GV_ALLOW_UNVERIFIED=1
			shift
			continue
			;;
		-h | --help)
			usage
			return 0
			;;
		*)
			usage >&2
			echo "gpu-validate: unknown option $1" >&2
			return 2
			;;
		esac
		shift 2
	done
	local v
	for v in GV_GPU GV_TRIALS GV_CLI_TRIALS GV_COLOCATE_SECONDS GV_LIMIT; do
		if ! [[ ${!v} =~ ^[0-9]+$ ]]; then
			echo "gpu-validate: ${v#GV_} must be a whole number, not \"${!v}\"" >&2
			return 2
		fi
	done
	[ -n "$GV_BUNDLE" ] || GV_BUNDLE=$(dirname "$SELF")
	GV_BUNDLE=$(readlink -f "$GV_BUNDLE")
	local f
	for f in arbiter gpureport; do
		if [ ! -x "$GV_BUNDLE/$f" ]; then
			echo "gpu-validate: no $f in $GV_BUNDLE: build the bundle with 'make gpu-validate-bundle' and run its gpu-validate.sh, or pass --bundle DIR" >&2
			return 2
		fi
	done
	export GV_ARBITER=$GV_BUNDLE/arbiter
	[ -n "$results" ] || results=./gpu-validate-$(date -u +%Y%m%dT%H%M%SZ)
	mkdir -p "$results"
	export GV_WORK
	GV_WORK=$(readlink -f "$results")
	: >"$GV_WORK/results.txt"
	export GV_T0=$SECONDS GV_EPOCH
	GV_EPOCH=$(date +%s)
	trap interrupted INT TERM
	log "results in $GV_WORK; limit ${GV_LIMIT}s"
	record_machine
	local s
	for s in ${sections//,/ }; do
		case $s in
		build | capture-cuda | capture-torch | nvrm | channels | colocate | daemon) run_section "$s" ;;
		*) log "unknown section $s (skipped)" ;;
		esac
	done
	local elapsed=$((SECONDS - GV_T0))
	emit "META elapsed $((elapsed / 60)) min $((elapsed % 60)) s of the $((GV_LIMIT / 60))-minute limit"
	if [ -n "$out" ]; then
		"$GV_BUNDLE/gpureport" render -o "$out" "$GV_WORK"
		cp "$out" "$GV_WORK/report.md"
		log "report in $out (results and raw output in $GV_WORK)"
	else
		"$GV_BUNDLE/gpureport" render -o "$GV_WORK/report.md" "$GV_WORK"
		cat "$GV_WORK/report.md"
		log "report above (results and raw output in $GV_WORK)"
	fi
}

# A section worker: run_section starts the script again as
# "__section NAME" under timeout.
if [ "${1:-}" = __section ]; then
	# shellcheck source-path=SCRIPTDIR source=gpu-validate-sections.sh
	. "$(dirname "$SELF")/gpu-validate-sections.sh"
	export GV_SECTION=$2 CUDA_VISIBLE_DEVICES=$GV_GPU
	SEC=$GV_WORK/$2
	TRACE_LIBS=()
	[ -z "${GV_STUB:-}" ] || TRACE_LIBS=(--lib "$GV_STUB/libcuda.so.1")
	trap 'exit 143' TERM INT
	"section_${2//-/_}"
	exit 0
fi
main "$@"
