// capture: the CUDA C program whose driver calls scripts/gpu-validate.sh
// captures with `arbiter trace`. It makes a known number of each kind of
// call Arbiter probes, through the CUDA runtime as applications do, and
// prints its own counts for the capture to be checked against.
//
// Usage:
//   capture [ITERATIONS]   each iteration: an async copy in, a kernel
//                          launch, a cudaLaunchKernelEx, a cooperative
//                          launch (where the GPU supports it), an event
//                          record, a stream wait on it, an async copy out,
//                          an event and a stream synchronize; every tenth
//                          also a graph launch, a synchronous copy each way
//                          from pageable memory and a device synchronize.
//                          Prints "calls: launches=N copies=N htod=N dtoh=N
//                          syncs=N".
//   capture bench LAUNCHES empty kernels launched back to back (a stream
//                          synchronize every 256); prints "train: N
//                          launches in S s: R launches/s".
// Built twice by the script: as is, and with --default-stream per-thread,
// whose calls reach the driver's _ptsz/_ptds entry points.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	fprintf(stderr, "capture: %s: %s\n", #x, cudaGetErrorString(e_)); exit(2); } } while (0)

__global__ void work(float *x, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		x[i] = x[i] * 2.0f + 1.0f;
}

__global__ void empty() {}

struct counts { int launches, copies, htod, dtoh, syncs; };

static int capture(int iterations)
{
	CHECK(cudaFree(0));
	const int n = 1 << 16;
	const size_t bytes = n * sizeof(float);
	float *pinned, *d;
	float *pageable = (float *)calloc(n, sizeof(float));
	if (!pageable) {
		fprintf(stderr, "capture: out of memory\n");
		return 2;
	}
	CHECK(cudaMallocHost((void **)&pinned, bytes));
	memset(pinned, 0, bytes);
	CHECK(cudaMalloc((void **)&d, bytes));
	cudaStream_t s, s2;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	cudaEvent_t ev;
	CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	int dev = 0, coop = 0;
	CHECK(cudaGetDevice(&dev));
	CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
	dim3 grid((n + 255) / 256), block(256);

	// The graph is built node by node, not captured from a stream: a
	// captured launch would itself be a launch call.
	void *args[] = { &d, (void *)&n };
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	cudaGraphNode_t node;
	cudaKernelNodeParams kp;
	memset(&kp, 0, sizeof kp);
	kp.func = (void *)work;
	kp.gridDim = grid;
	kp.blockDim = block;
	kp.kernelParams = args;
	CHECK(cudaGraphCreate(&graph, 0));
	CHECK(cudaGraphAddKernelNode(&node, graph, NULL, 0, &kp));
	CHECK(cudaGraphInstantiateWithFlags(&exec, graph, 0));

	counts c = {};
	for (int i = 0; i < iterations; i++) {
		CHECK(cudaMemcpyAsync(d, pinned, bytes, cudaMemcpyHostToDevice, s));
		c.copies++, c.htod++;
		work<<<grid, block, 0, s>>>(d, n);
		CHECK(cudaGetLastError());
		c.launches++;
#if CUDART_VERSION >= 11080
		cudaLaunchConfig_t cfg;
		memset(&cfg, 0, sizeof cfg);
		cfg.gridDim = grid;
		cfg.blockDim = block;
		cfg.stream = s;
		CHECK(cudaLaunchKernelEx(&cfg, work, d, n));
		c.launches++;
#endif
		if (coop) {
			CHECK(cudaLaunchCooperativeKernel((void *)work, dim3(1), block, args, 0, s));
			c.launches++;
		}
		CHECK(cudaEventRecord(ev, s));
		CHECK(cudaStreamWaitEvent(s2, ev, 0));
		c.syncs += 2;
		CHECK(cudaMemcpyAsync(pinned, d, bytes, cudaMemcpyDeviceToHost, s));
		c.copies++, c.dtoh++;
		CHECK(cudaEventSynchronize(ev));
		CHECK(cudaStreamSynchronize(s));
		c.syncs += 2;
		if (i % 10 == 0) {
			CHECK(cudaGraphLaunch(exec, s));
			c.launches++;
			CHECK(cudaMemcpy(d, pageable, bytes, cudaMemcpyHostToDevice));
			CHECK(cudaMemcpy(pageable, d, bytes, cudaMemcpyDeviceToHost));
			c.copies += 2, c.htod++, c.dtoh++;
			CHECK(cudaDeviceSynchronize());
			c.syncs++;
		}
	}
	printf("cooperative launch: %s\n", coop ? "supported" : "not supported by this GPU");
	printf("calls: launches=%d copies=%d htod=%d dtoh=%d syncs=%d\n", c.launches, c.copies, c.htod, c.dtoh, c.syncs);
	fflush(stdout);
	return 0;
}

static int bench(long launches)
{
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	for (int i = 0; i < 1000; i++)
		empty<<<1, 1, 0, s>>>();
	CHECK(cudaStreamSynchronize(s));
	auto t0 = std::chrono::steady_clock::now();
	for (long i = 1; i <= launches; i++) {
		empty<<<1, 1, 0, s>>>();
		if (i % 256 == 0)
			CHECK(cudaStreamSynchronize(s));
	}
	CHECK(cudaStreamSynchronize(s));
	double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
	fprintf(stderr, "train: %ld launches in %.2f s: %.1f launches/s\n", launches, secs, secs > 0 ? launches / secs : 0);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "bench") == 0)
		return bench(argc > 2 ? atol(argv[2]) : 100000);
	return capture(argc > 1 ? atoi(argv[1]) : 200);
}
