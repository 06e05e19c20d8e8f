/* calls.c: exercises the stub driver's return codes and timing emulation.
 * Prints one "name result" line per check; the Go test compares them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "cuda.h"

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

#define SHOW(name, call) printf("%s %d\n", name, (int)(call))

int main(void)
{
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
	CUstream s;
	CUevent ev;
	CUgraph g;
	CUgraphExec ge;
	CUdeviceptr d;
	char host[64];
	SHOW("cuDeviceGet-before-init", cuDeviceGet(&dev, 0));
	SHOW("cuInit", cuInit(0));
	SHOW("cuDeviceGet", cuDeviceGet(&dev, 0));
	SHOW("cuCtxCreate_v2", cuCtxCreate_v2(&ctx, 0, dev));
	SHOW("cuModuleLoadData", cuModuleLoadData(&mod, "x"));
	SHOW("cuModuleGetFunction", cuModuleGetFunction(&fn, mod, "k"));
	SHOW("cuStreamCreate", cuStreamCreate(&s, 0));
	SHOW("cuEventCreate", cuEventCreate(&ev, 0));
	SHOW("cuMemAlloc_v2", cuMemAlloc_v2(&d, 4096));
	SHOW("cuGraphCreate", cuGraphCreate(&g, 0));
	SHOW("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags(&ge, g, 0));

	CUstream bogus_stream = (CUstream)(uintptr_t)0xdead0000;
	CUfunction bogus_fn = (CUfunction)(uintptr_t)0xbeef0000;
	SHOW("cuLaunchKernel-bogus-function", cuLaunchKernel(bogus_fn, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
	SHOW("cuLaunchKernel-bogus-stream", cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, bogus_stream, NULL, NULL));
	SHOW("cuLaunchKernel-default-stream", cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
	SHOW("cuLaunchKernel_ptsz-per-thread", cuLaunchKernel_ptsz(fn, 1, 1, 1, 1, 1, 1, 0, CU_STREAM_PER_THREAD, NULL, NULL));
	CUlaunchConfig cfg = { 1, 1, 1, 1, 1, 1, 0, s, NULL, 0 };
	SHOW("cuLaunchKernelEx-null-config", cuLaunchKernelEx(NULL, fn, NULL, NULL));
	SHOW("cuLaunchKernelEx", cuLaunchKernelEx(&cfg, fn, NULL, NULL));
	SHOW("cuLaunchKernelEx_ptsz", cuLaunchKernelEx_ptsz(&cfg, fn, NULL, NULL));
	SHOW("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, NULL));
	SHOW("cuLaunchCooperativeKernel_ptsz", cuLaunchCooperativeKernel_ptsz(fn, 1, 1, 1, 1, 1, 1, 0, s, NULL));
	SHOW("cuGraphLaunch", cuGraphLaunch(ge, s));
	SHOW("cuGraphLaunch_ptsz-bogus", cuGraphLaunch_ptsz((CUgraphExec)(uintptr_t)8, s));
	SHOW("cuMemcpyHtoD-null-host", cuMemcpyHtoD((CUdeviceptr_v1)d, NULL, 64));
	SHOW("cuMemcpyHtoD", cuMemcpyHtoD((CUdeviceptr_v1)d, host, 64));
	SHOW("cuMemcpyHtoD_v2", cuMemcpyHtoD_v2(d, host, 64));
	SHOW("cuMemcpyHtoD_v2_ptds", cuMemcpyHtoD_v2_ptds(d, host, 64));
	SHOW("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync((CUdeviceptr_v1)d, host, 64, s));
	SHOW("cuMemcpyHtoDAsync_v2-bogus-stream", cuMemcpyHtoDAsync_v2(d, host, 64, bogus_stream));
	SHOW("cuMemcpyHtoDAsync_v2_ptsz", cuMemcpyHtoDAsync_v2_ptsz(d, host, 64, NULL));
	SHOW("cuMemcpyDtoH-null-device", cuMemcpyDtoH(host, 0, 64));
	SHOW("cuMemcpyDtoH_v2", cuMemcpyDtoH_v2(host, d, 64));
	SHOW("cuMemcpyDtoH_v2_ptds", cuMemcpyDtoH_v2_ptds(host, d, 64));
	SHOW("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync(host, (CUdeviceptr_v1)d, 64, s));
	SHOW("cuMemcpyDtoHAsync_v2", cuMemcpyDtoHAsync_v2(host, d, 64, s));
	SHOW("cuMemcpyDtoHAsync_v2_ptsz", cuMemcpyDtoHAsync_v2_ptsz(host, d, 64, s));
	SHOW("cuStreamSynchronize-bogus", cuStreamSynchronize(bogus_stream));
	SHOW("cuStreamSynchronize_ptsz", cuStreamSynchronize_ptsz(NULL));
	SHOW("cuEventSynchronize-bogus", cuEventSynchronize((CUevent)(uintptr_t)16));
	SHOW("cuStreamWaitEvent", cuStreamWaitEvent(s, ev, 0));
	SHOW("cuStreamWaitEvent_ptsz-bogus-event", cuStreamWaitEvent_ptsz(s, (CUevent)(uintptr_t)16, 0));
	SHOW("cuEventRecordWithFlags", cuEventRecordWithFlags(ev, s, 0));
	SHOW("cuEventRecordWithFlags_ptsz", cuEventRecordWithFlags_ptsz(ev, NULL, 0));
	SHOW("cuEventRecord_ptsz-bogus-stream", cuEventRecord_ptsz(ev, bogus_stream));
	SHOW("cuCtxSynchronize", cuCtxSynchronize());
	SHOW("cuCtxSynchronize_v2", cuCtxSynchronize_v2(ctx));
	SHOW("cuCtxSynchronize_v2-current", cuCtxSynchronize_v2(NULL));
	SHOW("cuCtxSynchronize_v2-bogus", cuCtxSynchronize_v2((CUcontext)(uintptr_t)16));

	/* Timing: 3 launches of 2 ms on s, then an event; the event sync must
	 * wait for all of it, and launches must return at once. */
	uint64_t kns = 2000000;
	void *params[] = { &kns };
	uint64_t t0 = now_ns();
	for (int i = 0; i < 3; i++)
		cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
	uint64_t t1 = now_ns();
	SHOW("cuEventRecord", cuEventRecord(ev, s));
	SHOW("cuEventSynchronize", cuEventSynchronize(ev));
	uint64_t t2 = now_ns();
	printf("launch-us %llu\nsync-us %llu\n", (unsigned long long)(t1 - t0) / 1000,
		(unsigned long long)(t2 - t0) / 1000);
	/* cuCtxSynchronize_v2 waits for its context's work, on the context
	 * given and on the current one for NULL. */
	t0 = now_ns();
	cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
	SHOW("cuCtxSynchronize_v2-after-launch", cuCtxSynchronize_v2(ctx));
	printf("ctx-sync-us %llu\n", (unsigned long long)(now_ns() - t0) / 1000);
	t0 = now_ns();
	cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
	SHOW("cuCtxSynchronize_v2-current-after-launch", cuCtxSynchronize_v2(NULL));
	printf("current-sync-us %llu\n", (unsigned long long)(now_ns() - t0) / 1000);
	/* A 12 MB synchronous copy takes 1 ms at 12 GB/s. */
	static char big[12000000];
	t0 = now_ns();
	SHOW("cuMemcpyHtoD_v2-12MB", cuMemcpyHtoD_v2(d, big, sizeof big));
	printf("copy-us %llu\n", (unsigned long long)(now_ns() - t0) / 1000);

	/* Both versions of cuStreamSynchronize are callable; a plain lookup
	 * (and the link above) binds the default. */
	typedef CUresult (*sync_fn)(CUstream);
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	sync_fn v1 = lib ? (sync_fn)dlvsym(lib, "cuStreamSynchronize", "LIBCUDA_1.0") : NULL;
	sync_fn v2 = lib ? (sync_fn)dlvsym(lib, "cuStreamSynchronize", "LIBCUDA_2.0") : NULL;
	sync_fn dflt = lib ? (sync_fn)dlsym(lib, "cuStreamSynchronize") : NULL;
	printf("versions-distinct %d\n", v1 != NULL && v2 != NULL && v1 != v2);
	printf("default-is-2.0 %d\n", dflt == v2 && (void *)dflt == (void *)cuStreamSynchronize);
	SHOW("cuStreamSynchronize@LIBCUDA_1.0", v1 ? v1(s) : -1);

	const char *name;
	SHOW("cuGetErrorName", cuGetErrorName(CUDA_ERROR_INVALID_HANDLE, &name));
	printf("name %s\n", name);
	SHOW("cuGetErrorName-unknown", cuGetErrorName((CUresult)12345, &name));
	SHOW("cuStreamDestroy_v2", cuStreamDestroy_v2(s));
	SHOW("cuStreamDestroy_v2-again", cuStreamDestroy_v2(s));
	SHOW("cuEventDestroy_v2", cuEventDestroy_v2(ev));
	SHOW("cuGraphExecDestroy", cuGraphExecDestroy(ge));
	SHOW("cuGraphDestroy", cuGraphDestroy(g));
	SHOW("cuMemFree_v2", cuMemFree_v2(d));
	SHOW("cuCtxDestroy_v2", cuCtxDestroy_v2(ctx));
	return 0;
}
