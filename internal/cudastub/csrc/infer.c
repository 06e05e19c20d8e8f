/*
 * infer.c: an inference-like workload for the stub CUDA driver.
 *
 * Requests arrive as a Poisson process at --rate per second (0: back to
 * back). Each request is one cuMemcpyHtoDAsync_v2 of --bytes, --launches
 * cuLaunchKernel of --kernel-us each, one cuMemcpyDtoHAsync_v2 and a
 * cuStreamSynchronize; with --sync-every N, also a cuStreamSynchronize
 * after every N launches (a model whose layers wait on the host, as a
 * decoder's steps do). It runs --requests requests (0: no limit) or for
 * --duration seconds (0: no limit), whichever ends first, or until SIGINT or
 * SIGTERM, then prints the requests' latency (first call to the return of
 * the last synchronize) on stderr:
 *   infer: 50 requests in 0.52 s: p50 1012 us, p99 1050 us, max 1061 us
 * and, for programs, one JSON line on stdout (latencies in microseconds):
 *   {"workload":"infer","requests":50,"seconds":0.52,"p50_us":1012,
 *    "p99_us":1050,"max_us":1061,"mean_us":1015.2}
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WORKLOAD_NAME "infer"
#include "workload.h" /* with cuda.h: BuildAt copies both beside this file */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* sleep_until sleeps to an absolute CLOCK_MONOTONIC time or until a signal
 * asks to stop. */
static void sleep_until(uint64_t t)
{
	struct timespec ts = { .tv_sec = t / 1000000000ULL, .tv_nsec = t % 1000000000ULL };
	while (!stop && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: infer [--rate REQ/S] [--launches N] [--kernel-us US] [--bytes B]\n"
		"             [--sync-every N] [--requests COUNT] [--duration SECONDS]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	double rate = 100, kernel_us = 100, duration = 0;
	unsigned long launches = 8, requests = 0, sync_every = 0;
	uint64_t bytes = 1 << 20;
	static const struct option opts[] = {
		{ "rate", required_argument, NULL, 'r' },
		{ "launches", required_argument, NULL, 'l' },
		{ "kernel-us", required_argument, NULL, 'k' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "requests", required_argument, NULL, 'n' },
		{ "duration", required_argument, NULL, 'd' },
		{ "sync-every", required_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		switch (c) {
		case 'r': rate = parse_num("rate", optarg); break;
		case 'l': launches = (unsigned long)parse_num("launches", optarg); break;
		case 'k': kernel_us = parse_num("kernel-us", optarg); break;
		case 'b': bytes = (uint64_t)parse_num("bytes", optarg); break;
		case 'n': requests = (unsigned long)parse_num("requests", optarg); break;
		case 'd': duration = parse_num("duration", optarg); break;
		case 's': sync_every = (unsigned long)parse_num("sync-every", optarg); break;
		default: usage();
		}
	}
	if (optind != argc)
		usage();

	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
	CUstream stream;
	CUdeviceptr dbuf;
	static const char image[] = "stub module";
	check(cuInit(0), "cuInit");
	check(cuDeviceGet(&dev, 0), "cuDeviceGet");
	check(cuCtxCreate_v2(&ctx, 0, dev), "cuCtxCreate_v2");
	check(cuModuleLoadData(&mod, image), "cuModuleLoadData");
	check(cuModuleGetFunction(&fn, mod, "infer_layer"), "cuModuleGetFunction");
	check(cuStreamCreate(&stream, 0), "cuStreamCreate");
	check(cuMemAlloc_v2(&dbuf, bytes ? bytes : 1), "cuMemAlloc_v2");
	unsigned char *host = calloc(1, bytes ? bytes : 1);
	size_t cap = 1024, n = 0;
	uint64_t *lat = malloc(cap * sizeof *lat);
	if (host == NULL || lat == NULL) {
		fprintf(stderr, "infer: out of memory\n");
		return 1;
	}

	uint64_t kns = (uint64_t)(kernel_us * 1000);
	void *params[] = { &kns };
	unsigned int seed = (unsigned int)getpid();
	uint64_t start = now_ns(), next = start;
	uint64_t end = duration > 0 ? start + (uint64_t)(duration * 1e9) : UINT64_MAX;
	while (!stop && (requests == 0 || n < requests)) {
		if (rate > 0) {
			double u = (rand_r(&seed) + 1.0) / ((double)RAND_MAX + 2.0);
			next += (uint64_t)(-log(u) / rate * 1e9);
			if (next >= end)
				break;
			sleep_until(next);
			if (stop)
				break;
		} else if (now_ns() >= end) {
			break;
		}
		uint64_t t0 = now_ns();
		check(cuMemcpyHtoDAsync_v2(dbuf, host, bytes, stream), "cuMemcpyHtoDAsync_v2");
		for (unsigned long i = 0; i < launches; i++) {
			check(cuLaunchKernel(fn, 64, 1, 1, 256, 1, 1, 0, stream, params, NULL), "cuLaunchKernel");
			if (sync_every > 0 && (i + 1) % sync_every == 0 && i + 1 < launches)
				check(cuStreamSynchronize(stream), "cuStreamSynchronize");
		}
		check(cuMemcpyDtoHAsync_v2(host, dbuf, bytes, stream), "cuMemcpyDtoHAsync_v2");
		check(cuStreamSynchronize(stream), "cuStreamSynchronize");
		if (n == cap) {
			cap *= 2;
			uint64_t *grown = realloc(lat, cap * sizeof *lat);
			if (grown == NULL) {
				fprintf(stderr, "infer: out of memory\n");
				return 1;
			}
			lat = grown;
		}
		lat[n++] = now_ns() - t0;
	}
	double secs = (now_ns() - start) / 1e9;

	check(cuStreamDestroy_v2(stream), "cuStreamDestroy_v2");
	check(cuMemFree_v2(dbuf), "cuMemFree_v2");
	check(cuCtxDestroy_v2(ctx), "cuCtxDestroy_v2");
	if (n == 0) {
		fprintf(stderr, "infer: 0 requests in %.2f s\n", secs);
		printf("{\"workload\":\"infer\",\"requests\":0,\"seconds\":%.3f}\n", secs);
		return 0;
	}
	double sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += lat[i];
	qsort(lat, n, sizeof *lat, cmp_u64);
	size_t p50 = (n - 1) / 2, p99 = (size_t)ceil(0.99 * n) - 1;
	fprintf(stderr, "infer: %zu requests in %.2f s: p50 %llu us, p99 %llu us, max %llu us\n", n, secs,
		(unsigned long long)(lat[p50] / 1000), (unsigned long long)(lat[p99] / 1000),
		(unsigned long long)(lat[n - 1] / 1000));
	printf("{\"workload\":\"infer\",\"requests\":%zu,\"seconds\":%.3f,\"p50_us\":%llu,\"p99_us\":%llu,"
	       "\"max_us\":%llu,\"mean_us\":%.1f}\n", n, secs,
		(unsigned long long)(lat[p50] / 1000), (unsigned long long)(lat[p99] / 1000),
		(unsigned long long)(lat[n - 1] / 1000), sum / n / 1000);
	free(lat);
	free(host);
	return 0;
}
