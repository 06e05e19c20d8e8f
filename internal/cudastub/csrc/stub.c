/*
 * stub.c: a stub CUDA driver, built as libcuda.so.1, for tests and the demo
 * on machines without a GPU.
 *
 * It exports the driver API entry points Arbiter probes, with the real
 * signatures (cuda.h beside this file), and emulates execution time so that
 * traced programs behave like GPU programs:
 *   - every process on the node that uses GPU index N shares one emulated
 *     GPU N (gpu.c): work is time-sliced between processes as the real
 *     scheduler time-slices channel groups, so co-located programs slow
 *     each other down as they would on hardware;
 *   - launches and async copies are asynchronous: they queue on their
 *     stream's lane of the process's channel group;
 *   - a launch whose kernelParams[0] points to a uint64_t queues that many
 *     nanoseconds of kernel time (no params: 0 ns);
 *   - a copy queues bytes / (12 GB/s); synchronous copies also wait for it;
 *   - synchronizing calls block until the work they wait on has run on the
 *     shared GPU.
 * Return codes are real CUresult values: CUDA_ERROR_INVALID_VALUE for NULL
 * pointers, CUDA_ERROR_INVALID_HANDLE for handles it never handed out
 * (CUDA_ERROR_INVALID_CONTEXT for a context passed to cuCtxSynchronize_v2).
 * Handles live in fixed pools and are checked by address, so a bogus handle
 * is reported, never dereferenced.
 *
 * Environment, read by cuInit:
 *   CUDA_VISIBLE_DEVICES       GPU indexes this process sees, "0,1" (default 0)
 *   ARBITER_STUB_TIMESLICE_US  this process's channel-group timeslice
 *                              (default 1024)
 *   ARBITER_STUB_NODE          a name that gives processes a node of GPUs
 *                              of their own (tests that must not share)
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda.h" /* internal/cudastub/cuda.h; BuildAt copies it beside this file */
#include "gpu.h"

#define EXPORT __attribute__((visibility("default")))

/* Emulated copy bandwidth: 12 GB/s = 12 bytes per ns. */
#define COPY_BYTES_PER_NS 12

enum { MAX_CTX = 64, MAX_MOD = 256, MAX_FUNC = 1024, MAX_STREAM = 1024,
       MAX_EVENT = 4096, MAX_GRAPH = 256, MAX_DEVICES = 16, MAX_GPU_INDEX = 255 };

struct CUctx_st { int used; CUdevice dev; };
struct CUmod_st { int used; };
struct CUfunc_st { int used; struct CUmod_st *mod; };
/* A stream's work goes to one lane of its device's channel group. */
struct CUstream_st { int used; CUdevice dev; unsigned lane; };
struct CUevent_st { int used; int recorded; CUdevice dev; unsigned lane; uint64_t ticket; };
struct CUgraph_st { int used; };
struct CUgraphExec_st { int used; };

/* All driver state; one instance, guarded by mu. */
static struct {
	pthread_mutex_t mu;
	int initialized;
	uint64_t next_devptr;
	/* Configuration from the environment (cuInit). */
	int ndev;
	int visible[MAX_DEVICES]; /* GPU index of each device ordinal */
	char node[64];
	uint64_t timeslice_ns;
	/* The shared GPUs this process uses, attached on first use. */
	int attached[MAX_DEVICES];
	struct gpu gpu[MAX_DEVICES];
	unsigned next_thread_lane;
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
};

/* The device of this thread's current context (cuCtxCreate makes the new
 * context current), and the lane of its per-thread default stream (_ptsz and
 * _ptds forms, CU_STREAM_PER_THREAD; 0 until first used). */
static __thread CUdevice current_dev;
static __thread unsigned per_thread_lane;

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

/* ---- configuration and devices ---- */

/* say reports a configuration or device error on stderr: the driver has no
 * other way to tell a program why cuInit or cuCtxCreate failed. */
static void say(const char *msg)
{
	fprintf(stderr, "libcuda.so.1 (arbiter stub driver): %s\n", msg);
}

/* configure reads the environment (see the top of this file). */
static CUresult configure(void)
{
	char msg[256];
	const char *v = getenv("CUDA_VISIBLE_DEVICES");
	drv.ndev = 1;
	drv.visible[0] = 0;
	if (v != NULL) {
		drv.ndev = 0;
		for (const char *p = v; *p != '\0';) {
			char *end;
			errno = 0;
			long idx = strtol(p, &end, 10);
			if (end == p || errno != 0 || idx < 0 || idx > MAX_GPU_INDEX || (*end != ',' && *end != '\0') ||
			    drv.ndev == MAX_DEVICES) {
				snprintf(msg, sizeof msg, "CUDA_VISIBLE_DEVICES=\"%s\": want up to %d GPU indexes from 0 to %d, "
					"separated by commas", v, MAX_DEVICES, MAX_GPU_INDEX);
				say(msg);
				return CUDA_ERROR_INVALID_VALUE;
			}
			drv.visible[drv.ndev++] = (int)idx;
			p = *end == ',' ? end + 1 : end;
		}
	}
	drv.timeslice_ns = GPU_DEFAULT_TIMESLICE_NS;
	if ((v = getenv("ARBITER_STUB_TIMESLICE_US")) != NULL) {
		char *end;
		errno = 0;
		unsigned long long us = strtoull(v, &end, 10);
		if (end == v || *end != '\0' || errno != 0 || us < 1 || us > 10000000 || v[0] == '-') {
			snprintf(msg, sizeof msg, "ARBITER_STUB_TIMESLICE_US=\"%s\": want a whole number of microseconds "
				"from 1 to 10000000", v);
			say(msg);
			return CUDA_ERROR_INVALID_VALUE;
		}
		drv.timeslice_ns = us * 1000;
	}
	drv.node[0] = '\0';
	if ((v = getenv("ARBITER_STUB_NODE")) != NULL) {
		size_t n = strlen(v);
		int ok = n < sizeof drv.node;
		for (size_t i = 0; ok && i < n; i++)
			ok = (v[i] >= 'a' && v[i] <= 'z') || (v[i] >= 'A' && v[i] <= 'Z') ||
			     (v[i] >= '0' && v[i] <= '9') || v[i] == '_' || v[i] == '.' || v[i] == '-';
		if (!ok) {
			snprintf(msg, sizeof msg, "ARBITER_STUB_NODE=\"%.64s\": want up to %zu letters, digits, '_', '.' "
				"or '-'", v, sizeof drv.node - 1);
			say(msg);
			return CUDA_ERROR_INVALID_VALUE;
		}
		memcpy(drv.node, v, n + 1);
	}
	return CUDA_SUCCESS;
}

/* device returns the shared GPU of device ordinal dev, attaching to it on
 * first use. Called under drv.mu. */
static struct gpu *device(CUdevice dev, CUresult *r)
{
	if (!drv.initialized) {
		*r = CUDA_ERROR_NOT_INITIALIZED;
		return NULL;
	}
	if (dev < 0 || dev >= drv.ndev) {
		*r = CUDA_ERROR_INVALID_DEVICE;
		return NULL;
	}
	if (!drv.attached[dev]) {
		char err[256];
		if (gpu_attach(&drv.gpu[dev], drv.node, drv.visible[dev], drv.timeslice_ns, err, sizeof err) != 0) {
			say(err);
			*r = CUDA_ERROR_NO_DEVICE;
			return NULL;
		}
		drv.attached[dev] = 1;
	}
	*r = CUDA_SUCCESS;
	return &drv.gpu[dev];
}

/* forget_devices runs in a forked child: the parent's channel groups are
 * not the child's. */
static void forget_devices(void)
{
	for (int i = 0; i < MAX_DEVICES; i++) {
		if (drv.attached[i])
			gpu_forget(&drv.gpu[i]);
		drv.attached[i] = 0;
	}
	pthread_mutex_init(&drv.mu, NULL);
}

__attribute__((constructor)) static void stub_init(void)
{
	pthread_atfork(NULL, NULL, forget_devices);
}

/* At exit the process's channel groups go, and their queued work with
 * them, as on a real GPU. */
__attribute__((destructor)) static void stub_fini(void)
{
	for (int i = 0; i < MAX_DEVICES; i++)
		if (drv.attached[i])
			gpu_leave(&drv.gpu[i]);
}

/* ---- streams, launches, copies ---- */

/* A target is where a call's work goes: a shared GPU and a lane of this
 * process's group on it. */
struct target {
	struct gpu *gpu;
	unsigned lane;
};

/* stream_target resolves a stream handle. ptsz says whether the call is a
 * per-thread-default-stream form, where NULL means this thread's stream. */
static CUresult stream_target(CUstream h, int ptsz, struct target *t)
{
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&drv.mu);
	CUdevice dev = current_dev;
	if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
		t->lane = 0;
		if ((h == NULL && ptsz) || h == CU_STREAM_PER_THREAD) {
			if (per_thread_lane == 0)
				per_thread_lane = 1 + drv.next_thread_lane++ % (GPU_LANES - 1);
			t->lane = per_thread_lane;
		}
	} else {
		struct CUstream_st *s = POOL_GET(stream, h);
		if (s == NULL)
			r = CUDA_ERROR_INVALID_HANDLE;
		else
			dev = s->dev, t->lane = s->lane;
	}
	if (r == CUDA_SUCCESS)
		t->gpu = device(dev, &r);
	pthread_mutex_unlock(&drv.mu);
	return r;
}

/* wait_for blocks until t's lane has run everything up to ticket. */
static void wait_for(struct target t, uint64_t ticket)
{
	uint64_t want[GPU_LANES] = { 0 };
	want[t.lane] = ticket;
	gpu_wait(t.gpu, want);
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
	int known = POOL_GET(func, f) != NULL;
	pthread_mutex_unlock(&drv.mu);
	struct target t;
	CUresult r = stream_target(h, ptsz, &t);
	if (r == CUDA_SUCCESS && !known)
		r = CUDA_ERROR_INVALID_HANDLE;
	if (r != CUDA_SUCCESS)
		return r;
	gpu_submit(t.gpu, t.lane, kernel_ns(kernelParams));
	return CUDA_SUCCESS;
}

/* copy emulates a copy of n bytes on stream h; a synchronous copy (wait)
 * returns only when it is done. */
static CUresult copy(uint64_t dev, const void *host, uint64_t n, CUstream h, int ptsz, int wait)
{
	if (dev == 0 || host == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	struct target t;
	CUresult r = stream_target(h, ptsz, &t);
	if (r != CUDA_SUCCESS)
		return r;
	uint64_t ticket = gpu_submit(t.gpu, t.lane, n / COPY_BYTES_PER_NS);
	if (wait)
		wait_for(t, ticket);
	return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream h, int ptsz)
{
	struct target t;
	CUresult r = stream_target(h, ptsz, &t);
	if (r != CUDA_SUCCESS)
		return r;
	wait_for(t, gpu_submit(t.gpu, t.lane, 0));
	return CUDA_SUCCESS;
}

/* event_of resolves an event handle and copies what it recorded. */
static struct CUevent_st *event_of(CUevent e, struct CUevent_st *out)
{
	pthread_mutex_lock(&drv.mu);
	struct CUevent_st *ev = POOL_GET(event, e);
	if (ev != NULL)
		*out = *ev;
	pthread_mutex_unlock(&drv.mu);
	return ev;
}

static CUresult stream_wait_event(CUstream h, CUevent e, int ptsz)
{
	struct target t;
	struct CUevent_st ev;
	CUresult r = stream_target(h, ptsz, &t);
	if (r != CUDA_SUCCESS)
		return r;
	if (event_of(e, &ev) == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!ev.recorded)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&drv.mu);
	struct gpu *evgpu = device(ev.dev, &r);
	pthread_mutex_unlock(&drv.mu);
	if (r != CUDA_SUCCESS)
		return r;
	/* The stream waits on the GPU; where that cannot be expressed (another
	 * device, or a lane that already waits) the host waits instead, which
	 * keeps the order as well. */
	if (evgpu != t.gpu || gpu_wait_lane(t.gpu, t.lane, ev.lane, ev.ticket) != 0)
		wait_for((struct target){ evgpu, ev.lane }, ev.ticket);
	return CUDA_SUCCESS;
}

static CUresult event_record(CUevent e, CUstream h, int ptsz)
{
	struct target t;
	struct CUevent_st tmp;
	CUresult r = stream_target(h, ptsz, &t);
	if (r != CUDA_SUCCESS)
		return r;
	if (event_of(e, &tmp) == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	uint64_t ticket = gpu_submit(t.gpu, t.lane, 0);
	pthread_mutex_lock(&drv.mu);
	struct CUevent_st *ev = POOL_GET(event, e);
	if (ev != NULL) {
		ev->dev = (CUdevice)(t.gpu - drv.gpu);
		ev->lane = t.lane;
		ev->ticket = ticket;
		ev->recorded = 1;
	}
	pthread_mutex_unlock(&drv.mu);
	return ev != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- setup and teardown ---- */

EXPORT CUresult cuInit(unsigned int Flags)
{
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&drv.mu);
	CUresult r = drv.initialized ? CUDA_SUCCESS : configure();
	if (r == CUDA_SUCCESS)
		__atomic_store_n(&drv.initialized, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&drv.mu);
	return r;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
	if (count == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!__atomic_load_n(&drv.initialized, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_NOT_INITIALIZED;
	*count = drv.ndev;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	if (device == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!__atomic_load_n(&drv.initialized, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ordinal < 0 || ordinal >= drv.ndev)
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	(void)flags;
	if (pctx == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!__atomic_load_n(&drv.initialized, __ATOMIC_ACQUIRE))
		return CUDA_ERROR_NOT_INITIALIZED;
	pthread_mutex_lock(&drv.mu);
	CUresult r;
	struct CUctx_st *c = NULL;
	if (device(dev, &r) != NULL && (c = POOL_NEW(ctx)) != NULL) {
		c->dev = dev;
		current_dev = dev;
	} else if (r == CUDA_SUCCESS) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_unlock(&drv.mu);
	if (c == NULL)
		return r;
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
	if (phStream == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&drv.mu);
	struct CUstream_st *s = POOL_NEW(stream);
	if (s != NULL) {
		s->dev = current_dev;
		/* Lane 0 is the legacy default stream's. */
		s->lane = 1 + (unsigned)(s - drv.stream) % (GPU_LANES - 1);
	}
	pthread_mutex_unlock(&drv.mu);
	if (s == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*phStream = s;
	return CUDA_SUCCESS;
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
	int known = POOL_GET(graph_exec, g) != NULL;
	pthread_mutex_unlock(&drv.mu);
	struct target t;
	CUresult r = stream_target(h, ptsz, &t);
	if (r == CUDA_SUCCESS && !known)
		r = CUDA_ERROR_INVALID_HANDLE;
	if (r != CUDA_SUCCESS)
		return r;
	gpu_submit(t.gpu, t.lane, 0);
	return CUDA_SUCCESS;
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

/* ctx_sync waits for everything this process queued on ctx's device; a
 * NULL ctx is this thread's current context. */
static CUresult ctx_sync(CUcontext ctx)
{
	/* A process that has queued nothing on the device has nothing to
	 * wait for (even before cuInit, as the stub always allowed). */
	pthread_mutex_lock(&drv.mu);
	CUdevice dev = current_dev;
	if (ctx != NULL) {
		struct CUctx_st *c = POOL_GET(ctx, ctx);
		if (c == NULL) {
			pthread_mutex_unlock(&drv.mu);
			return CUDA_ERROR_INVALID_CONTEXT;
		}
		dev = c->dev;
	}
	struct gpu *g = dev >= 0 && dev < MAX_DEVICES && drv.attached[dev] ? &drv.gpu[dev] : NULL;
	pthread_mutex_unlock(&drv.mu);
	if (g == NULL)
		return CUDA_SUCCESS;
	uint64_t want[GPU_LANES];
	gpu_tickets(g, want);
	gpu_wait(g, want);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void)
{
	return ctx_sync(NULL);
}

/* CUDA 13's cuda.h maps cuCtxSynchronize to this form, so cudart 13 calls
 * it (NULL: the current context). */
EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
	return ctx_sync(ctx);
}

EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
	struct CUevent_st ev;
	if (event_of(hEvent, &ev) == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!ev.recorded)
		return CUDA_SUCCESS;
	CUresult r;
	pthread_mutex_lock(&drv.mu);
	struct gpu *g = device(ev.dev, &r);
	pthread_mutex_unlock(&drv.mu);
	if (g == NULL)
		return r;
	wait_for((struct target){ g, ev.lane }, ev.ticket);
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
