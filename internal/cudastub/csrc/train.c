/*
 * train.c: a training-like workload for the stub CUDA driver.
 *
 * An endless stream of cuLaunchKernel of --kernel-us each on one stream with
 * a cuStreamSynchronize after every --sync-every launches. It runs
 * --iterations launches (0: no limit) or for --duration seconds (0: no
 * limit), whichever ends first, or until SIGINT or SIGTERM, then prints on
 * stderr:
 *   train: 2000 launches in 10.01 s: 199.8 launches/s
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
	unsigned long n = 0;
	while (!stop && (iterations == 0 || n < iterations) && now_ns() < end) {
		check(cuLaunchKernel(fn, 1024, 1, 1, 512, 1, 1, 49152, stream, params, NULL), "cuLaunchKernel");
		if (++n % sync_every == 0)
			check(cuStreamSynchronize(stream), "cuStreamSynchronize");
	}
	check(cuStreamSynchronize(stream), "cuStreamSynchronize");
	double secs = (now_ns() - start) / 1e9;
	check(cuStreamDestroy_v2(stream), "cuStreamDestroy_v2");
	check(cuCtxDestroy_v2(ctx), "cuCtxDestroy_v2");
	fprintf(stderr, "train: %lu launches in %.2f s: %.1f launches/s\n", n, secs, secs > 0 ? n / secs : 0);
	return 0;
}
