/*
 * workload.h: what the stub driver's workload programs (infer.c, train.c)
 * share. Each program defines WORKLOAD_NAME before including it; errors
 * and usage messages start with that name.
 */
#ifndef CUDASTUB_WORKLOAD_H
#define CUDASTUB_WORKLOAD_H

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda.h"

/* stop is set by SIGINT or SIGTERM; the programs' loops end on it. */
static volatile sig_atomic_t stop;

static void on_signal(int sig) { (void)sig; stop = 1; }

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* check exits with a message naming the failed call and its CUresult. */
static void check(CUresult r, const char *what)
{
	if (r == CUDA_SUCCESS)
		return;
	const char *name = NULL;
	cuGetErrorName(r, &name);
	fprintf(stderr, WORKLOAD_NAME ": %s: %s (%d)\n", what, name ? name : "unknown error", (int)r);
	exit(1);
}

/* parse_num parses --flag's value as a non-negative number, or exits 2. */
static double parse_num(const char *flag, const char *s)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || v < 0 || isnan(v)) {
		fprintf(stderr, WORKLOAD_NAME ": --%s: want a non-negative number, got \"%s\"\n", flag, s);
		exit(2);
	}
	return v;
}

#endif
