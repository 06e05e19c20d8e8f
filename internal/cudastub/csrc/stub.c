/*
 * stub.c: a stub CUDA driver, built as libcuda.so.1, for tests and the demo
 * on machines without a GPU.
 *
 * It exports the driver API entry points Arbiter probes, with the real
 * signatures (cuda.h beside this file), and emulates execution time so that
 * traced programs behave like GPU programs:
 *   - launches and async copies are asynchronous: each stream keeps a
 *     "busy until" time on CLOCK_MONOTONIC and work queues behind it;
 *   - a launch whose kernelParams[0] points to a uint64_t adds that many
 *     nanoseconds of kernel time to its stream (no params: 0 ns);
 *   - a copy adds bytes / (12 GB/s); synchronous copies also wait for it;
 *   - synchronizing calls block until the stream(s) they wait on are idle:
 *     clock_nanosleep to ~50 us before the deadline, then spin.
 * Return codes are real CUresult values: CUDA_ERROR_INVALID_VALUE for NULL
 * pointers, CUDA_ERROR_INVALID_HANDLE for handles it never handed out.
 * Handles live in fixed pools and are checked by address, so a bogus handle
 * is reported, never dereferenced.
 *
 * cuStreamSynchronize is exported twice: the default version
 * cuStreamSynchronize@@LIBCUDA_2.0 and an older cuStreamSynchronize@LIBCUDA_1.0
 * (libcuda.map), so a tracer that attaches to the wrong duplicate is caught.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "cuda.h" /* internal/cudastub/cuda.h; BuildAt copies it beside this file */

#define EXPORT __attribute__((visibility("default")))

/* Emulated copy bandwidth: 12 GB/s = 12 bytes per ns. */
#define COPY_BYTES_PER_NS 12
/* Synchronizers sleep until this long before the deadline, then spin. */
#define SPIN_NS 50000ULL

enum { MAX_CTX = 64, MAX_MOD = 256, MAX_FUNC = 1024, MAX_STREAM = 1024,
       MAX_EVENT = 4096, MAX_GRAPH = 256 };

struct CUctx_st { int used; CUdevice dev; };
struct CUmod_st { int used; };
struct CUfunc_st { int used; struct CUmod_st *mod; };
struct CUstream_st { int used; uint64_t busy_until; };
struct CUevent_st { int used; int recorded; uint64_t time; };
struct CUgraph_st { int used; };
struct CUgraphExec_st { int used; };

/* All driver state; one instance, guarded by mu. */
static struct {
	pthread_mutex_t mu;
	int initialized;
	uint64_t latest; /* the latest busy_until of any stream: cuCtxSynchronize */
	uint64_t next_devptr;
	struct CUstream_st legacy; /* the legacy default stream (NULL handle) */
	struct CUctx_st ctx[MAX_CTX];
	struct CUmod_st mod[MAX_MOD];
	struct CUfunc_st func[MAX_FUNC];
	struct CUstream_st stream[MAX_STREAM];
	struct CUevent_st event[MAX_EVENT];
	struct CUgraph_st graph[MAX_GRAPH];
	struct CUgraphExec_st graph_exec[MAX_GRAPH];
} drv = {
	.mu = PTHREAD_MUTEX_INITIALIZER,
	.next_devptr = 0x302000000ULL,
	.legacy = { .used = 1 },
};

/* The per-thread default stream (_ptsz/_ptds forms, CU_STREAM_PER_THREAD). */
static __thread struct CUstream_st per_thread = { .used = 1 };

/* pool_index returns p's index in a pool of n elements of size sz starting
 * at base, or -1 when p does not point at an element. */
static long pool_index(const void *p, const void *base, size_t sz, long n)
{
	uintptr_t off = (uintptr_t)p - (uintptr_t)base;
	if ((uintptr_t)p < (uintptr_t)base || off % sz != 0 || (long)(off / sz) >= n)
		return -1;
	return (long)(off / sz);
}

#define POOL_GET(pool, p) \
	(pool_index((p), drv.pool, sizeof drv.pool[0], sizeof drv.pool / sizeof drv.pool[0]) >= 0 && \
	 ((typeof(&drv.pool[0]))(p))->used ? (typeof(&drv.pool[0]))(p) : NULL)

#define POOL_NEW(pool) ({ \
	typeof(&drv.pool[0]) _r = NULL; \
	for (size_t _i = 0; _i < sizeof drv.pool / sizeof drv.pool[0]; _i++) \
		if (!drv.pool[_i].used) { \
			memset(&drv.pool[_i], 0, sizeof drv.pool[_i]); \
			drv.pool[_i].used = 1; _r = &drv.pool[_i]; break; \
		} \
	_r; })

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* wait_until blocks until CLOCK_MONOTONIC reaches deadline: it sleeps until
 * SPIN_NS before it (signals do not cut the wait short), then spins. */
static void wait_until(uint64_t deadline)
{
	for (;;) {
		uint64_t now = now_ns();
		if (now >= deadline)
			return;
		if (deadline - now > SPIN_NS) {
			uint64_t wake = deadline - SPIN_NS;
			struct timespec ts = { .tv_sec = wake / 1000000000ULL,
			                       .tv_nsec = wake % 1000000000ULL };
			clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
			continue;
		}
		__builtin_ia32_pause();
	}
}

/* stream_of resolves a stream handle under drv.mu. ptsz says whether the
 * call is a per-thread-default-stream form, where NULL means this thread's
 * stream. Returns NULL for an unknown handle. */
static struct CUstream_st *stream_of(CUstream h, int ptsz)
{
	if (h == NULL)
		return ptsz ? &per_thread : &drv.legacy;
	if (h == CU_STREAM_LEGACY)
		return &drv.legacy;
	if (h == CU_STREAM_PER_THREAD)
		return &per_thread;
	return POOL_GET(stream, h);
}

/* enqueue adds ns of emulated work to s (under drv.mu) and returns when the
 * stream will be idle. */
static uint64_t enqueue(struct CUstream_st *s, uint64_t ns)
{
	uint64_t start = now_ns();
	if (s->busy_until > start)
		start = s->busy_until;
	s->busy_until = start + ns;
	if (s->busy_until > drv.latest)
		drv.latest = s->busy_until;
	return s->busy_until;
}

static uint64_t kernel_ns(void **kernelParams)
{
	if (kernelParams == NULL || kernelParams[0] == NULL)
		return 0;
	return *(const uint64_t *)kernelParams[0];
}

static CUresult launch(CUfunction f, CUstream h, int ptsz, void **kernelParams)
{
	pthread_mutex_lock(&drv.mu);
	struct CUstream_st *s = stream_of(h, ptsz);
	if (s == NULL || POOL_GET(func, f) == NULL) {
		pthread_mutex_unlock(&drv.mu);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	enqueue(s, kernel_ns(kernelParams));
	pthread_mutex_unlock(&drv.mu);
	return CUDA_SUCCESS;
}

/* copy emulates a copy of n bytes on stream h; a synchronous copy (wait)
 * returns only when it is done. */
static CUresult copy(uint64_t dev, const void *host, uint64_t n, CUstream h, int ptsz, int wait)
{
	if (dev == 0 || host == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&drv.mu);
	struct CUstream_st *s = stream_of(h, ptsz);
	if (s == NULL) {
		pthread_mutex_unlock(&drv.mu);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	uint64_t done = enqueue(s, n / COPY_BYTES_PER_NS);
	pthread_mutex_unlock(&drv.mu);
	if (wait)
		wait_until(done);
	return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream h, int ptsz)
{
	pthread_mutex_lock(&drv.mu);
	struct CUstream_st *s = stream_of(h, ptsz);
	if (s == NULL) {
		pthread_mutex_unlock(&drv.mu);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	uint64_t deadline = s->busy_until;
	pthread_mutex_unlock(&drv.mu);
	wait_until(deadline);
	return CUDA_SUCCESS;
}

static CUresult stream_wait_event(CUstream h, CUevent e, int ptsz)
{
	pthread_mutex_lock(&drv.mu);
	struct CUstream_st *s = stream_of(h, ptsz);
	struct CUevent_st *ev = POOL_GET(event, e);
	CUresult r = CUDA_ERROR_INVALID_HANDLE;
	if (s != NULL && ev != NULL) {
		if (ev->recorded && ev->time > s->busy_until)
			s->busy_until = ev->time;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&drv.mu);
	return r;
}

static CUresult event_record(CUevent e, CUstream h, int ptsz)
{
	pthread_mutex_lock(&drv.mu);
	struct CUstream_st *s = stream_of(h, ptsz);
	struct CUevent_st *ev = POOL_GET(event, e);
	CUresult r = CUDA_ERROR_INVALID_HANDLE;
	if (s != NULL && ev != NULL) {
		ev->time = enqueue(s, 0);
		ev->recorded = 1;
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&drv.mu);
	return r;
}

/* ---- setup and teardown ---- */

EXPORT CUresult cuInit(unsigned int Flags)
{
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&drv.mu);
	drv.initialized = 1;
	pthread_mutex_unlock(&drv.mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
	if (count == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!__atomic_load_n(&drv.initialized, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_NOT_INITIALIZED;
	*count = 1;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	if (device == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!__atomic_load_n(&drv.initialized, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ordinal != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*device = 0;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	(void)flags;
	if (pctx == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!__atomic_load_n(&drv.initialized, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&drv.mu);
	struct CUctx_st *c = POOL_NEW(ctx);
	if (c != NULL)
		c->dev = dev;
	pthread_mutex_unlock(&drv.mu);
	if (c == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*pctx = c;
	return CUDA_SUCCESS;
}

#define DESTROY(pool, h) do { \
	pthread_mutex_lock(&drv.mu); \
	typeof(&drv.pool[0]) _p = POOL_GET(pool, h); \
	if (_p != NULL) \
		_p->used = 0; \
	pthread_mutex_unlock(&drv.mu); \
	return _p != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; \
} while (0)

#define CREATE(pool, out) do { \
	if ((out) == NULL) \
		return CUDA_ERROR_INVALID_VALUE; \
	pthread_mutex_lock(&drv.mu); \
	typeof(&drv.pool[0]) _p = POOL_NEW(pool); \
	pthread_mutex_unlock(&drv.mu); \
	if (_p == NULL) \
		return CUDA_ERROR_OUT_OF_MEMORY; \
	*(out) = _p; \
	return CUDA_SUCCESS; \
} while (0)

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { DESTROY(ctx, ctx); }

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	(void)Flags;
	CREATE(stream, phStream);
}

EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) { DESTROY(stream, hStream); }

EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	(void)Flags;
	CREATE(event, phEvent);
}

EXPORT CUresult cuEventDestroy_v2(CUevent hEvent) { DESTROY(event, hEvent); }

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	if (image == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	CREATE(mod, module);
}

EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	if (hfunc == NULL || name == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&drv.mu);
	struct CUfunc_st *f = NULL;
	struct CUmod_st *m = POOL_GET(mod, hmod);
	if (m != NULL && (f = POOL_NEW(func)) != NULL)
		f->mod = m;
	pthread_mutex_unlock(&drv.mu);
	if (m == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	if (f == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*hfunc = f;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	if (dptr == NULL || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&drv.mu);
	*dptr = drv.next_devptr;
	/* Device allocations are 2 MiB aligned, as the real driver's are. */
	drv.next_devptr += (bytesize + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1);
	pthread_mutex_unlock(&drv.mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	return dptr == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr)
{
	static const struct { CUresult code; const char *name; } names[] = {
		{ CUDA_SUCCESS, "CUDA_SUCCESS" },
		{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE" },
		{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY" },
		{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED" },
		{ CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED" },
		{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE" },
		{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE" },
		{ CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE" },
		{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT" },
		{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE" },
		{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND" },
		{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY" },
		{ CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED" },
		{ CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN" },
	};
	if (pStr == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		if (names[i].code == error) {
			*pStr = names[i].name;
			return CUDA_SUCCESS;
		}
	}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	CREATE(graph, phGraph);
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
	(void)flags;
	pthread_mutex_lock(&drv.mu);
	struct CUgraph_st *g = POOL_GET(graph, hGraph);
	pthread_mutex_unlock(&drv.mu);
	if (g == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	CREATE(graph_exec, phGraphExec);
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) { DESTROY(graph_exec, hGraphExec); }

EXPORT CUresult cuGraphDestroy(CUgraph hGraph) { DESTROY(graph, hGraph); }

/* ---- launches ---- */

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
	unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
	unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
	(void)gridDimX; (void)gridDimY; (void)gridDimZ; (void)blockDimX; (void)blockDimY;
	(void)blockDimZ; (void)sharedMemBytes; (void)extra;
	return launch(f, hStream, 0, kernelParams);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
	unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
	unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
	(void)gridDimX; (void)gridDimY; (void)gridDimZ; (void)blockDimX; (void)blockDimY;
	(void)blockDimZ; (void)sharedMemBytes; (void)extra;
	return launch(f, hStream, 1, kernelParams);
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
	(void)extra;
	if (config == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return launch(f, config->hStream, 0, kernelParams);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
	(void)extra;
	if (config == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	return launch(f, config->hStream, 1, kernelParams);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
	unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
	unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)
{
	(void)gridDimX; (void)gridDimY; (void)gridDimZ; (void)blockDimX; (void)blockDimY;
	(void)blockDimZ; (void)sharedMemBytes;
	return launch(f, hStream, 0, kernelParams);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
	unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
	unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)
{
	(void)gridDimX; (void)gridDimY; (void)gridDimZ; (void)blockDimX; (void)blockDimY;
	(void)blockDimZ; (void)sharedMemBytes;
	return launch(f, hStream, 1, kernelParams);
}

static CUresult graph_launch(CUgraphExec g, CUstream h, int ptsz)
{
	pthread_mutex_lock(&drv.mu);
	struct CUstream_st *s = stream_of(h, ptsz);
	CUresult r = CUDA_ERROR_INVALID_HANDLE;
	if (s != NULL && POOL_GET(graph_exec, g) != NULL) {
		enqueue(s, 0);
		r = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&drv.mu);
	return r;
}

EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	return graph_launch(hGraphExec, hStream, 0);
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	return graph_launch(hGraphExec, hStream, 1);
}

/* ---- copies ---- */

EXPORT CUresult cuMemcpyHtoD(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount)
{
	return copy(dstDevice, srcHost, ByteCount, NULL, 0, 1);
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	return copy(dstDevice, srcHost, ByteCount, NULL, 0, 1);
}

EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	return copy(dstDevice, srcHost, ByteCount, NULL, 1, 1);
}

EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount, CUstream hStream)
{
	return copy(dstDevice, srcHost, ByteCount, hStream, 0, 0);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
	return copy(dstDevice, srcHost, ByteCount, hStream, 0, 0);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
	return copy(dstDevice, srcHost, ByteCount, hStream, 1, 0);
}

EXPORT CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
	return copy(srcDevice, dstHost, ByteCount, NULL, 0, 1);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	return copy(srcDevice, dstHost, ByteCount, NULL, 0, 1);
}

EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	return copy(srcDevice, dstHost, ByteCount, NULL, 1, 1);
}

EXPORT CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount, CUstream hStream)
{
	return copy(srcDevice, dstHost, ByteCount, hStream, 0, 0);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	return copy(srcDevice, dstHost, ByteCount, hStream, 0, 0);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	return copy(srcDevice, dstHost, ByteCount, hStream, 1, 0);
}

/* ---- synchronizers ---- */

/* The default version, cuStreamSynchronize@@LIBCUDA_2.0 (libcuda.map). */
EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
	return stream_sync(hStream, 0);
}

/* The older duplicate, cuStreamSynchronize@LIBCUDA_1.0. Its body differs
 * from the default's (a NULL stream means the per-thread stream, as in an
 * imagined older ABI) so the compiler cannot fold the two into one address. */
EXPORT __attribute__((symver("cuStreamSynchronize@LIBCUDA_1.0")))
CUresult stub_cuStreamSynchronize_v1(CUstream hStream)
{
	return stream_sync(hStream, 1);
}

EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
	return stream_sync(hStream, 1);
}

EXPORT CUresult cuCtxSynchronize(void)
{
	pthread_mutex_lock(&drv.mu);
	uint64_t deadline = drv.latest;
	pthread_mutex_unlock(&drv.mu);
	wait_until(deadline);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
	pthread_mutex_lock(&drv.mu);
	struct CUevent_st *ev = POOL_GET(event, hEvent);
	uint64_t deadline = ev != NULL && ev->recorded ? ev->time : 0;
	pthread_mutex_unlock(&drv.mu);
	if (ev == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	wait_until(deadline);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	(void)Flags;
	return stream_wait_event(hStream, hEvent, 0);
}

EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	(void)Flags;
	return stream_wait_event(hStream, hEvent, 1);
}

EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	return event_record(hEvent, hStream, 0);
}

EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
	return event_record(hEvent, hStream, 1);
}

EXPORT CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	(void)flags;
	return event_record(hEvent, hStream, 0);
}

EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	(void)flags;
	return event_record(hEvent, hStream, 1);
}
