/*
 * exercise: calls the probed CUDA driver functions of the stub driver with
 * arguments derived from the call index, so a test can predict every field
 * of every captured event.
 *
 *   exercise calls N      call i (0 <= i < N) goes to variant i % 31 (the
 *                         order of trace.Funcs) with args(i) below
 *   exercise sync US      a real launch of US µs emulated kernel time, then
 *                         the synchronizers on real and on bad handles;
 *                         prints the handles it used
 *   exercise serve        reads commands from stdin: "launch N" times N
 *                         cuLaunchKernel calls and prints ns per call;
 *                         "sync N" the same for cuStreamSynchronize on an
 *                         idle stream; "copy N" for cuMemcpyHtoD_v2 of
 *                         16 bytes;
 *                         "calls N" runs the calls mode; "quit" exits
 *   exercise oldsync      calls cuStreamSynchronize@LIBCUDA_1.0 (the hidden
 *                         older version) 10 times, then the default once
 *   exercise threads T N US
 *                         T threads at once, each with a stream of its
 *                         own: N times a launch of US µs emulated kernel
 *                         time and a cuStreamSynchronize waiting for it;
 *                         each thread first prints "tid=TID stream=S"
 *
 * With EXERCISE_WAIT set, it first reads one line from stdin, so that a
 * test can start it before attaching the probes and let it go after.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cudastub/cuda.h>

/* Handle-like 64-bit values: distinct per call and per argument. */
static uint64_t h(uint64_t i, uint64_t k) { return 0x100000000ULL * (i % 13 + 1) + i * 64 + k * 8; }

#define F(i) ((CUfunction)h(i, 0))
#define STREAM(i) ((CUstream)h(i, 1))
#define EVENT(i) ((CUevent)h(i, 4))
#define CTX(i) ((CUcontext)h(i, 5))
#define GX(i) ((unsigned)((i) % 65535 + 1))
#define GY(i) ((unsigned)((i) % 7 + 1))
#define GZ(i) ((unsigned)((i) % 5 + 1))
#define BX(i) ((unsigned)((i) % 1024 + 1))
#define BY(i) ((unsigned)((i) % 3 + 1))
#define BZ(i) ((unsigned)((i) % 2 + 1))
#define SHM(i) ((unsigned)(((i) * 16) % 65536))
#define DEV(i) ((CUdeviceptr)h(i, 2))
#define DEV32(i) ((CUdeviceptr_v1)((i) * 4096 + 4096))
#define HOST(i) ((void *)h(i, 3))
#define BYTES(i) ((size_t)((i) % 4096 + 1))

static CUresult call(uint64_t i)
{
	CUlaunchConfig cfg = { GX(i), GY(i), GZ(i), BX(i), BY(i), BZ(i), SHM(i), STREAM(i), NULL, 0 };
	switch (i % 31) {
	case 0: return cuLaunchKernel(F(i), GX(i), GY(i), GZ(i), BX(i), BY(i), BZ(i), SHM(i), STREAM(i), NULL, NULL);
	case 1: return cuLaunchKernel_ptsz(F(i), GX(i), GY(i), GZ(i), BX(i), BY(i), BZ(i), SHM(i), STREAM(i), NULL, NULL);
	case 2: return cuLaunchKernelEx(&cfg, F(i), NULL, NULL);
	case 3: return cuLaunchKernelEx_ptsz(&cfg, F(i), NULL, NULL);
	case 4: return cuLaunchCooperativeKernel(F(i), GX(i), GY(i), GZ(i), BX(i), BY(i), BZ(i), SHM(i), STREAM(i), NULL);
	case 5: return cuLaunchCooperativeKernel_ptsz(F(i), GX(i), GY(i), GZ(i), BX(i), BY(i), BZ(i), SHM(i), STREAM(i), NULL);
	case 6: return cuGraphLaunch((CUgraphExec)F(i), STREAM(i));
	case 7: return cuGraphLaunch_ptsz((CUgraphExec)F(i), STREAM(i));
	case 8: return cuMemcpyHtoD(DEV32(i), HOST(i), (unsigned)BYTES(i));
	case 9: return cuMemcpyHtoD_v2(DEV(i), HOST(i), BYTES(i));
	case 10: return cuMemcpyHtoD_v2_ptds(DEV(i), HOST(i), BYTES(i));
	case 11: return cuMemcpyHtoDAsync(DEV32(i), HOST(i), (unsigned)BYTES(i), STREAM(i));
	case 12: return cuMemcpyHtoDAsync_v2(DEV(i), HOST(i), BYTES(i), STREAM(i));
	case 13: return cuMemcpyHtoDAsync_v2_ptsz(DEV(i), HOST(i), BYTES(i), STREAM(i));
	case 14: return cuMemcpyDtoH(HOST(i), DEV32(i), (unsigned)BYTES(i));
	case 15: return cuMemcpyDtoH_v2(HOST(i), DEV(i), BYTES(i));
	case 16: return cuMemcpyDtoH_v2_ptds(HOST(i), DEV(i), BYTES(i));
	case 17: return cuMemcpyDtoHAsync(HOST(i), DEV32(i), (unsigned)BYTES(i), STREAM(i));
	case 18: return cuMemcpyDtoHAsync_v2(HOST(i), DEV(i), BYTES(i), STREAM(i));
	case 19: return cuMemcpyDtoHAsync_v2_ptsz(HOST(i), DEV(i), BYTES(i), STREAM(i));
	case 20: return cuStreamSynchronize(STREAM(i));
	case 21: return cuStreamSynchronize_ptsz(STREAM(i));
	case 22: return cuCtxSynchronize();
	case 23: return cuEventSynchronize(EVENT(i));
	case 24: return cuStreamWaitEvent(STREAM(i), EVENT(i), 0);
	case 25: return cuStreamWaitEvent_ptsz(STREAM(i), EVENT(i), 0);
	case 26: return cuEventRecord(EVENT(i), STREAM(i));
	case 27: return cuEventRecord_ptsz(EVENT(i), STREAM(i));
	case 28: return cuEventRecordWithFlags(EVENT(i), STREAM(i), 0);
	case 29: return cuEventRecordWithFlags_ptsz(EVENT(i), STREAM(i), 0);
	default: return cuCtxSynchronize_v2(CTX(i));
	}
}

static void calls(uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		call(i);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int check(CUresult r, const char *what)
{
	if (r != CUDA_SUCCESS) {
		fprintf(stderr, "exercise: %s: CUresult %d\n", what, r);
		exit(1);
	}
	return 0;
}

static void sync_mode(uint64_t us)
{
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
	CUstream s;
	CUevent ev;
	check(cuInit(0), "cuInit");
	check(cuDeviceGet(&dev, 0), "cuDeviceGet");
	check(cuCtxCreate_v2(&ctx, 0, dev), "cuCtxCreate");
	check(cuModuleLoadData(&mod, "stub"), "cuModuleLoadData");
	check(cuModuleGetFunction(&fn, mod, "kernel"), "cuModuleGetFunction");
	check(cuStreamCreate(&s, 0), "cuStreamCreate");
	check(cuEventCreate(&ev, 0), "cuEventCreate");
	uint64_t ns = us * 1000;
	void *params[] = { &ns };
	printf("stream=%llu event=%llu function=%llu context=%llu ns=%llu\n", (unsigned long long)(uintptr_t)s,
		(unsigned long long)(uintptr_t)ev, (unsigned long long)(uintptr_t)fn, (unsigned long long)(uintptr_t)ctx,
		(unsigned long long)ns);
	fflush(stdout);
	/* 1: stream sync waits for the kernel */
	check(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), "cuLaunchKernel");
	check(cuStreamSynchronize(s), "cuStreamSynchronize");
	/* 2: a bad stream */
	if (cuStreamSynchronize((CUstream)0xbad0) != CUDA_ERROR_INVALID_HANDLE)
		exit(2);
	/* 3: event record and event sync wait for the kernel */
	check(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), "cuLaunchKernel");
	check(cuEventRecord(ev, s), "cuEventRecord");
	check(cuEventSynchronize(ev), "cuEventSynchronize");
	/* 4: context sync waits for the kernel */
	check(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), "cuLaunchKernel");
	check(cuCtxSynchronize(), "cuCtxSynchronize");
	/* 5: cuCtxSynchronize_v2 waits for the kernel, on the context given
	 * and on the current one (NULL); a bad context */
	check(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), "cuLaunchKernel");
	check(cuCtxSynchronize_v2(ctx), "cuCtxSynchronize_v2");
	check(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), "cuLaunchKernel");
	check(cuCtxSynchronize_v2(NULL), "cuCtxSynchronize_v2(NULL)");
	if (cuCtxSynchronize_v2((CUcontext)0xbad0) != CUDA_ERROR_INVALID_CONTEXT)
		exit(2);
}

static void serve(void)
{
	char line[128];
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
	CUstream s;
	check(cuInit(0), "cuInit");
	check(cuDeviceGet(&dev, 0), "cuDeviceGet");
	check(cuCtxCreate_v2(&ctx, 0, dev), "cuCtxCreate");
	check(cuModuleLoadData(&mod, "stub"), "cuModuleLoadData");
	check(cuModuleGetFunction(&fn, mod, "kernel"), "cuModuleGetFunction");
	check(cuStreamCreate(&s, 0), "cuStreamCreate");
	printf("ready\n");
	fflush(stdout);
	while (fgets(line, sizeof line, stdin) != NULL) {
		unsigned long long n;
		if (sscanf(line, "launch %llu", &n) == 1) {
			uint64_t t0 = now_ns();
			for (unsigned long long i = 0; i < n; i++)
				cuLaunchKernel(fn, GX(i), GY(i), GZ(i), BX(i), BY(i), BZ(i), SHM(i), s, NULL, NULL);
			uint64_t t1 = now_ns();
			printf("%.1f\n", (double)(t1 - t0) / (double)n);
		} else if (sscanf(line, "sync %llu", &n) == 1) {
			uint64_t t0 = now_ns();
			for (unsigned long long i = 0; i < n; i++)
				cuStreamSynchronize(s);
			uint64_t t1 = now_ns();
			printf("%.1f\n", (double)(t1 - t0) / (double)n);
		} else if (sscanf(line, "copy %llu", &n) == 1) {
			static char buf[16];
			CUdeviceptr d;
			check(cuMemAlloc_v2(&d, sizeof buf), "cuMemAlloc");
			uint64_t t0 = now_ns();
			for (unsigned long long i = 0; i < n; i++)
				cuMemcpyHtoD_v2(d, buf, sizeof buf);
			uint64_t t1 = now_ns();
			printf("%.1f\n", (double)(t1 - t0) / (double)n);
		} else if (sscanf(line, "calls %llu", &n) == 1) {
			calls(n);
			printf("done\n");
		} else {
			break;
		}
		fflush(stdout);
	}
}

static void oldsync(void)
{
	CUresult (*old)(CUstream) = (CUresult(*)(CUstream))dlvsym(RTLD_DEFAULT, "cuStreamSynchronize", "LIBCUDA_1.0");
	if (old == NULL) {
		fprintf(stderr, "exercise: no cuStreamSynchronize@LIBCUDA_1.0: %s\n", dlerror());
		exit(1);
	}
	for (int i = 0; i < 10; i++)
		old((CUstream)0x01d0);
	cuStreamSynchronize((CUstream)0x2e40);
}

/* threads mode: one thread's work. */
struct worker {
	pthread_t thread;
	uint64_t n, ns;
};

static pthread_mutex_t print_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t start_line;

static void *work(void *arg)
{
	struct worker *w = arg;
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
	CUstream s;
	check(cuDeviceGet(&dev, 0), "cuDeviceGet");
	check(cuCtxCreate_v2(&ctx, 0, dev), "cuCtxCreate");
	check(cuModuleLoadData(&mod, "stub"), "cuModuleLoadData");
	check(cuModuleGetFunction(&fn, mod, "kernel"), "cuModuleGetFunction");
	check(cuStreamCreate(&s, 0), "cuStreamCreate");
	pthread_mutex_lock(&print_mu);
	printf("tid=%ld stream=%llu\n", (long)gettid(), (unsigned long long)(uintptr_t)s);
	fflush(stdout);
	pthread_mutex_unlock(&print_mu);
	pthread_barrier_wait(&start_line);
	void *params[] = { &w->ns };
	for (uint64_t i = 0; i < w->n; i++) {
		check(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), "cuLaunchKernel");
		check(cuStreamSynchronize(s), "cuStreamSynchronize");
	}
	return NULL;
}

static void threads_mode(unsigned t, uint64_t n, uint64_t us)
{
	struct worker w[64];
	if (t < 1 || t > 64) {
		fprintf(stderr, "exercise: threads: 1 to 64\n");
		exit(2);
	}
	check(cuInit(0), "cuInit");
	pthread_barrier_init(&start_line, NULL, t);
	for (unsigned i = 0; i < t; i++) {
		w[i].n = n;
		w[i].ns = us * 1000;
		if (pthread_create(&w[i].thread, NULL, work, &w[i]) != 0)
			exit(1);
	}
	for (unsigned i = 0; i < t; i++)
		pthread_join(w[i].thread, NULL);
}

int main(int argc, char **argv)
{
	if (getenv("EXERCISE_WAIT") != NULL) {
		char line[16];
		if (fgets(line, sizeof line, stdin) == NULL)
			return 3;
	}
	if (argc == 3 && strcmp(argv[1], "calls") == 0)
		calls(strtoull(argv[2], NULL, 10));
	else if (argc == 3 && strcmp(argv[1], "sync") == 0)
		sync_mode(strtoull(argv[2], NULL, 10));
	else if (argc == 2 && strcmp(argv[1], "serve") == 0)
		serve();
	else if (argc == 2 && strcmp(argv[1], "oldsync") == 0)
		oldsync();
	else if (argc == 5 && strcmp(argv[1], "threads") == 0)
		threads_mode((unsigned)strtoul(argv[2], NULL, 10), strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
	else {
		fprintf(stderr, "usage: exercise calls N | sync US | serve | oldsync | threads T N US\n");
		return 2;
	}
	return 0;
}
