#!/usr/bin/env bash
# Validate Arbiter's driver channel control on a real NVIDIA GPU server
# (H100/H200; any GPU with driver 525-610 works) and write the results as
# Markdown ready for docs/gpu-validation.md.
#
# What it does, as root:
#   1. records the machine: date, kernel, driver, GPU (nvidia-smi);
#   2. builds a CUDA C victim: one spinning kernel that writes the GPU global
#      timer and a counter into host-mapped memory until told to stop, then
#      runs a vector addition and checks it;
#   3. runs nvrm's TestGPUValidate against it: the eBPF tracer records the
#      victim's context creation (allocation sequence, channel groups and
#      their engines, CUDA's own SET_TIMESLICE), then this process controls
#      the victim through pidfd_getfd: GET_INFO, SET/GET_TIMESLICE over a
#      range of values, interleave levels, suspend/resume TRIALS times with
#      each method (FIFO_DISABLE_CHANNELS, GPFIFO_SCHEDULE{0} + PREEMPT), with
#      the latency until the kernel stops and restarts (p50/p99/max),
#      disable-only and preempt-only variants, correctness after resume;
#   4. exercises the CLI: arbiter channels watch / list / timeslice /
#      suspend --for / resume on a second victim.
#
# Usage: sudo scripts/gpu-validate-nvrm.sh [OUT.md]   (TRIALS=100 GPU=0)
# A driver newer than the newest Arbiter's layouts were checked against
# (595.45.04) is refused; ARBITER_ALLOW_UNVERIFIED_DRIVER=1 runs the
# procedure on it anyway, with the 595 branch's layouts
# (--allow-unverified-driver), and the report says which driver it was.
# Needs: Go, nvcc (CUDA toolkit), the NVIDIA driver loaded, root.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-gpu-validation-nvrm-$(date -u +%Y%m%dT%H%M%SZ).md}
TRIALS=${TRIALS:-100}
GPU=${GPU:-0}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

die() { echo "gpu-validate-nvrm: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (eBPF, pidfd_getfd of another process)"
[ -e /dev/nvidiactl ] || die "/dev/nvidiactl absent: no NVIDIA driver loaded"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found"
command -v nvcc >/dev/null || die "nvcc not found (install the CUDA toolkit or put it on PATH)"
command -v go >/dev/null || die "go not found"

# The victim. One thread of one block spins; everything it writes goes to
# host-mapped memory, so the validator reads its progress with
# process_vm_readv without touching the GPU itself.
cat >"$WORK/victim.cu" <<'CUDA'
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	fprintf(stderr, "victim: %s: %s\n", #x, cudaGetErrorString(e_)); exit(2); } } while (0)

struct progress { unsigned long long gpu_ns, count, stop; };

__global__ void spin(volatile progress *p)
{
	unsigned long long t;
	while (!p->stop) {
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
		p->gpu_ns = t;
		p->count = p->count + 1;
		__threadfence_system();
	}
}

__global__ void add(const float *a, const float *b, float *c, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		c[i] = a[i] + b[i];
}

int main()
{
	CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));
	progress *h, *d;
	CHECK(cudaHostAlloc((void **)&h, sizeof(*h), cudaHostAllocMapped));
	memset(h, 0, sizeof(*h));
	CHECK(cudaHostGetDevicePointer((void **)&d, h, 0));
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	spin<<<1, 1, 0, s>>>(d);
	CHECK(cudaGetLastError());
	while (((volatile progress *)h)->count == 0)
		;
	printf("ready %p\n", (void *)h);
	fflush(stdout);

	char line[64];
	if (!fgets(line, sizeof line, stdin) || strncmp(line, "stop", 4) != 0)
		return 3;
	((volatile progress *)h)->stop = 1;
	CHECK(cudaStreamSynchronize(s));

	const int n = 1 << 20;
	float *a, *b, *c;
	CHECK(cudaMallocManaged(&a, n * sizeof(float)));
	CHECK(cudaMallocManaged(&b, n * sizeof(float)));
	CHECK(cudaMallocManaged(&c, n * sizeof(float)));
	for (int i = 0; i < n; i++) { a[i] = i; b[i] = 2 * i; }
	add<<<(n + 255) / 256, 256>>>(a, b, c, n);
	CHECK(cudaDeviceSynchronize());
	int bad = 0;
	for (int i = 0; i < n; i++)
		bad += c[i] != 3.0f * i;
	if (bad)
		printf("wrong: %d of %d elements\n", bad, n);
	else
		printf("correct: %d elements, spin count %llu\n", n, h->count);
	fflush(stdout);
	return bad != 0;
}
CUDA
nvcc -O2 -o "$WORK/victim" "$WORK/victim.cu"

{
	echo "## Driver channel control (nvrm) — $(date -u +%Y-%m-%d)"
	echo
	echo "- Host: $(uname -n), kernel $(uname -r)"
	echo "- Driver: $(cat /sys/module/nvidia/version 2>/dev/null || head -1 /proc/driver/nvidia/version)"
	echo "- GPU $GPU: $(nvidia-smi -i "$GPU" --query-gpu=name,pci.bus_id,vbios_version,compute_mode --format=csv,noheader)"
	echo "- Compute policy timeslice: $(nvidia-smi compute-policy -l 2>/dev/null | tr -s ' \n' ' ' || echo n/a)"
	echo "- Arbiter: $(git describe --tags --always --dirty 2>/dev/null || echo unknown)"
	echo "- Procedure: scripts/gpu-validate-nvrm.sh, TRIALS=$TRIALS, victim on CUDA_VISIBLE_DEVICES=$GPU (compare with the device instance traced below)"
	echo "- GPUs: $(nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader | tr '\n' ';')"
	echo
} >"$OUT"

# 1-3: the library-level validation.
export CUDA_VISIBLE_DEVICES=$GPU
ARBITER_GPU_VICTIM="$WORK/victim" ARBITER_GPU_TRIALS="$TRIALS" ARBITER_GPU_REPORT="$WORK/lib.md" \
	go test -count=1 -timeout 20m -run '^TestGPUValidate$' -v ./nvrm/ >"$WORK/lib.log" 2>&1 || echo "TestGPUValidate FAILED (log below)" >>"$WORK/lib.md"
cat "$WORK/lib.md" >>"$OUT"
echo >>"$OUT"

# 4: the CLI on a second victim.
go build -o "$WORK/arbiter" ./cmd/arbiter
STATE="$WORK/state"
PIN=/sys/fs/bpf/arbiter-validate-$$
A=("$WORK/arbiter" channels --state-dir "$STATE" --pin-path "$PIN" ${ARBITER_ALLOW_UNVERIFIED_DRIVER:+--allow-unverified-driver})
"${A[@]}" watch --duration 20s >"$WORK/watch.txt" 2>&1 &
WATCH=$!
sleep 2
coproc VICTIM { "$WORK/victim"; }
read -r ready addr <&"${VICTIM[0]}"
VPID=$VICTIM_PID
wait "$WATCH" || true
{
	echo "### arbiter channels (CLI)"
	echo
	echo '```'
	echo "\$ arbiter channels watch   # while the victim started"
	grep " pid $VPID " "$WORK/watch.txt" | head -60 || true
	echo "\$ arbiter channels list"
	"${A[@]}" list 2>&1 || true
	echo "\$ arbiter channels timeslice $VPID 200"
	"${A[@]}" timeslice "$VPID" 200 2>&1 || true
	echo "\$ arbiter channels suspend $VPID --for 2s"
	"${A[@]}" suspend "$VPID" --for 2s 2>&1 || true
	echo "\$ arbiter channels resume $VPID"
	"${A[@]}" resume "$VPID" 2>&1 || true
	echo "\$ arbiter channels interleave $VPID high"
	"${A[@]}" interleave "$VPID" high 2>&1 || true
	echo '```'
} >>"$OUT"
echo stop >&"${VICTIM[1]}"
read -r verdict <&"${VICTIM[0]}" || verdict="(no answer)"
echo >>"$OUT"
echo "Second victim after CLI suspend/resume: \`$verdict\`." >>"$OUT"
"${A[@]}" watch --duration 10ms --pin=false >/dev/null 2>&1 || true
rm -rf "$PIN" 2>/dev/null || true

{
	echo
	echo "<details><summary>go test log</summary>"
	echo
	echo '```'
	tail -200 "$WORK/lib.log"
	echo '```'
	echo "</details>"
} >>"$OUT"
echo "gpu-validate-nvrm: results in $OUT (append to docs/gpu-validation.md)"
