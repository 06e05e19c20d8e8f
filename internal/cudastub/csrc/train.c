/*
 * train.c: a training-like workload for the stub CUDA driver.
 *
 * An endless stream of cuLaunchKernel of --kernel-us each on one stream with
 * a cuStreamSynchronize after every --sync-every launches. It runs
 * --iterations launches (0: no limit) or for --duration seconds (0: no
 * limit), whichever ends first, or until SIGINT or SIGTERM, then prints on
 * stderr:
 *   train: 2000 launches in 10.01 s: 199.8 launches/s
 * and, for programs, one JSON line on stdout:
 *   {"workload":"train","launches":2000,"completed":2000,"seconds":10.01,
 *    "launches_per_s":199.8,"kernel_us":5000,"lost":0}
 * A launch counts as completed when a synchronize after it returns. At exit
 * train checks that no work was lost: every launch completed, and no sooner
 * than its kernels could have run one after another on the GPU. If not, it
 * says so and exits with status 1.
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
#include <time.h>

#define WORKLOAD_NAME "train"
#include "workload.h" /* with cuda.h: BuildAt copies both beside this file */

static void usage(void)
{
	fprintf(stderr, "usage: train [--kernel-us US] [--sync-every N] [--duration SECONDS] [--iterations COUNT]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	double kernel_us = 5000, duration = 0;
	unsigned long sync_every = 10, iterations = 0;
	static const struct option opts[] = {
		{ "kernel-us", required_argument, NULL, 'k' },
		{ "sync-every", required_argument, NULL, 's' },
		{ "duration", required_argument, NULL, 'd' },
		{ "iterations", required_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		switch (c) {
		case 'k': kernel_us = parse_num("kernel-us", optarg); break;
		case 's': sync_every = (unsigned long)parse_num("sync-every", optarg); break;
		case 'd': duration = parse_num("duration", optarg); break;
		case 'n': iterations = (unsigned long)parse_num("iterations", optarg); break;
		default: usage();
		}
	}
	if (optind != argc)
		usage();
	if (sync_every == 0)
		sync_every = 1;

	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
	CUstream stream;
	static const char image[] = "stub module";
	check(cuInit(0), "cuInit");
	check(cuDeviceGet(&dev, 0), "cuDeviceGet");
	check(cuCtxCreate_v2(&ctx, 0, dev), "cuCtxCreate_v2");
	check(cuModuleLoadData(&mod, image), "cuModuleLoadData");
	check(cuModuleGetFunction(&fn, mod, "train_step"), "cuModuleGetFunction");
	check(cuStreamCreate(&stream, 0), "cuStreamCreate");

	uint64_t kns = (uint64_t)(kernel_us * 1000);
	void *params[] = { &kns };
	uint64_t start = now_ns();
	uint64_t end = duration > 0 ? start + (uint64_t)(duration * 1e9) : UINT64_MAX;
	unsigned long n = 0, completed = 0;
	while (!stop && (iterations == 0 || n < iterations) && now_ns() < end) {
		check(cuLaunchKernel(fn, 1024, 1, 1, 512, 1, 1, 49152, stream, params, NULL), "cuLaunchKernel");
		if (++n % sync_every == 0) {
			check(cuStreamSynchronize(stream), "cuStreamSynchronize");
			completed = n;
		}
	}
	check(cuStreamSynchronize(stream), "cuStreamSynchronize");
	completed = n;
	uint64_t elapsed = now_ns() - start;
	double secs = elapsed / 1e9;
	check(cuStreamDestroy_v2(stream), "cuStreamDestroy_v2");
	check(cuCtxDestroy_v2(ctx), "cuCtxDestroy_v2");
	fprintf(stderr, "train: %lu launches in %.2f s: %.1f launches/s\n", n, secs, secs > 0 ? completed / secs : 0);
	/* One stream runs its kernels one after another: all of them cannot
	 * have completed sooner than their summed durations. */
	unsigned long lost = n - completed;
	if (lost == 0 && elapsed < (uint64_t)n * kns) {
		unsigned long could = kns > 0 ? (unsigned long)(elapsed / kns) : n;
		lost = n - could;
	}
	printf("{\"workload\":\"train\",\"launches\":%lu,\"completed\":%lu,\"seconds\":%.3f,"
	       "\"launches_per_s\":%.1f,\"kernel_us\":%g,\"lost\":%lu}\n",
		n, completed, secs, secs > 0 ? completed / secs : 0, kernel_us, lost);
	if (lost > 0) {
		fprintf(stderr, "train: lost work: %lu of %lu launches of %g us completed in %.6f s, which could run "
			"only %lu; the driver dropped or skipped work\n", completed, n, kernel_us, secs, n - lost);
		return 1;
	}
	return 0;
}
