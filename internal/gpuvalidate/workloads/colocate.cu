// colocate: the co-location workloads of scripts/gpu-validate.sh, with the
// command lines and summary lines of the stub driver's infer and train
// (internal/cudastub), so that one parser reads both.
//
// Usage:
//   colocate lc [--rate REQ/S] [--launches N] [--kernel-us US] [--bytes B]
//               [--duration S] [--wait]
//       latency-critical: requests arriving at a Poisson rate, each an async
//       copy in, N kernels of US µs on a few blocks, an async copy out and
//       a stream synchronize; prints on stderr
//       "infer: N requests in S s: p50 X us, p99 Y us, max Z us".
//   colocate be [--kernel-us US] [--sync-every N] [--duration S] [--wait]
//       best-effort: kernels of US µs on every SM back to back, a stream
//       synchronize every N; prints "train: N launches in S s: R launches/s".
// With --wait it creates its context and warms up, prints "ready" and waits
// for a line on stdin before it starts, so that controls can be applied to
// its channel groups first.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	fprintf(stderr, "colocate: %s: %s\n", #x, cudaGetErrorString(e_)); exit(2); } } while (0)

__global__ void spin(unsigned long long ns)
{
	unsigned long long t0, t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
	do {
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	} while (t - t0 < ns);
}

struct options {
	double rate = 100, kernel_us = 100, duration = 10;
	long launches = 4, bytes = 1 << 20, sync_every = 4;
	bool wait = false;
};

static double now_s()
{
	using namespace std::chrono;
	return duration<double>(steady_clock::now().time_since_epoch()).count();
}

static void await_go(const options &o)
{
	if (!o.wait)
		return;
	printf("ready\n");
	fflush(stdout);
	char line[64];
	if (!fgets(line, sizeof line, stdin))
		exit(3);
}

static int lc(const options &o)
{
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	void *host, *dev;
	size_t bytes = o.bytes > 0 ? o.bytes : 1;
	CHECK(cudaMallocHost(&host, bytes));
	CHECK(cudaMalloc(&dev, bytes));
	unsigned long long kns = (unsigned long long)(o.kernel_us * 1000);
	auto request = [&]() {
		CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s));
		for (long i = 0; i < o.launches; i++)
			spin<<<16, 128, 0, s>>>(kns);
		CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s));
		CHECK(cudaStreamSynchronize(s));
	};
	request(); // warm-up
	await_go(o);
	// xorshift64: <random> does not build with every nvcc and host
	// compiler pair.
	unsigned long long rng = 0x9E3779B97F4A7C15ull;
	auto gap = [&]() {
		rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
		double u = ((rng >> 11) + 1.0) / 9007199254740993.0; // (0, 1]
		return -std::log(u) / o.rate;
	};
	std::vector<double> lat;
	double start = now_s(), next = start, end = start + o.duration;
	while (true) {
		if (o.rate > 0) {
			next += gap();
			if (next >= end)
				break;
			double wait = next - now_s();
			if (wait > 0)
				std::this_thread::sleep_for(std::chrono::duration<double>(wait));
		} else if (now_s() >= end) {
			break;
		}
		double t0 = now_s();
		request();
		lat.push_back((now_s() - t0) * 1e6);
	}
	double secs = now_s() - start;
	if (lat.empty()) {
		fprintf(stderr, "infer: 0 requests in %.2f s\n", secs);
		return 0;
	}
	std::sort(lat.begin(), lat.end());
	auto at = [&](double q) { return lat[std::min(lat.size() - 1, (size_t)(q * lat.size()))]; };
	fprintf(stderr, "infer: %zu requests in %.2f s: p50 %.0f us, p99 %.0f us, max %.0f us\n",
		lat.size(), secs, at(0.5), at(0.99), lat.back());
	return 0;
}

static int be(const options &o)
{
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	int dev = 0, sms = 1;
	CHECK(cudaGetDevice(&dev));
	CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
	unsigned long long kns = (unsigned long long)(o.kernel_us * 1000);
	spin<<<sms * 2, 256, 0, s>>>(1000); // warm-up
	CHECK(cudaStreamSynchronize(s));
	await_go(o);
	long every = o.sync_every > 0 ? o.sync_every : 1, n = 0;
	double start = now_s(), end = start + o.duration;
	while (now_s() < end) {
		spin<<<sms * 2, 256, 0, s>>>(kns);
		CHECK(cudaGetLastError());
		if (++n % every == 0)
			CHECK(cudaStreamSynchronize(s));
	}
	CHECK(cudaStreamSynchronize(s));
	double secs = now_s() - start;
	fprintf(stderr, "train: %ld launches in %.2f s: %.1f launches/s\n", n, secs, secs > 0 ? n / secs : 0);
	return 0;
}

static void usage()
{
	fprintf(stderr, "usage: colocate lc|be [--rate R] [--launches N] [--kernel-us US] [--bytes B] "
			"[--sync-every N] [--duration S] [--wait]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		usage();
	options o;
	bool is_lc = strcmp(argv[1], "lc") == 0;
	if (!is_lc && strcmp(argv[1], "be") != 0)
		usage();
	if (!is_lc)
		o.kernel_us = 10000;
	for (int i = 2; i < argc; i++) {
		const char *f = argv[i];
		if (strcmp(f, "--wait") == 0) {
			o.wait = true;
			continue;
		}
		if (i + 1 >= argc)
			usage();
		double v = atof(argv[++i]);
		if (strcmp(f, "--rate") == 0) o.rate = v;
		else if (strcmp(f, "--kernel-us") == 0) o.kernel_us = v;
		else if (strcmp(f, "--duration") == 0) o.duration = v;
		else if (strcmp(f, "--launches") == 0) o.launches = (long)v;
		else if (strcmp(f, "--bytes") == 0) o.bytes = (long)v;
		else if (strcmp(f, "--sync-every") == 0) o.sync_every = (long)v;
		else usage();
	}
	return is_lc ? lc(o) : be(o);
}
