// victim: the channel-control victim of scripts/gpu-validate.sh and of
// nvrm's TestGPUValidate. One thread of one block spins, writing the GPU
// global timer and a counter into host-mapped memory until told to stop,
// so that another process sees its progress (process_vm_readv) without
// touching the GPU; then it runs a vector addition and checks it.
//
// Usage: victim [--monitor]
// Prints "ready ADDR" (the progress struct's address) once the kernel
// spins, then waits for "stop" on stdin, stops the kernel and prints
// "correct: ..." or "wrong: ...". With --monitor it also prints "monitor
// on", and a host thread polls the counter and prints
//   stall START_MS LENGTH_MS
// (START in wall-clock ms since the epoch) each time the kernel made no
// progress for more than 5 ms, when it moves again.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
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

static double wall_ms()
{
	using namespace std::chrono;
	return duration<double, std::milli>(system_clock::now().time_since_epoch()).count();
}

// monitor reports each time the counter stood still for over 5 ms.
static void monitor(volatile progress *h, std::atomic<bool> *done)
{
	unsigned long long last = h->count;
	double since = wall_ms();
	while (!done->load()) {
		unsigned long long c = h->count;
		double now = wall_ms();
		if (c != last) {
			if (now - since > 5.0) {
				printf("stall %.3f %.3f\n", since, now - since);
				fflush(stdout);
			}
			last = c;
			since = now;
		}
		std::this_thread::sleep_for(std::chrono::microseconds(50));
	}
}

int main(int argc, char **argv)
{
	bool watch = argc > 1 && strcmp(argv[1], "--monitor") == 0;
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
	std::atomic<bool> done(false);
	std::thread mon;
	if (watch) {
		printf("monitor on\n");
		fflush(stdout);
		mon = std::thread(monitor, (volatile progress *)h, &done);
	}

	char line[64];
	if (!fgets(line, sizeof line, stdin) || strncmp(line, "stop", 4) != 0)
		return 3;
	if (watch) {
		done = true;
		mon.join();
	}
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
