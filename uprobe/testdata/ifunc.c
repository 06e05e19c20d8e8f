/*
 * ifunc: a library whose cuLaunchKernel is a GNU indirect function (built
 * with -DLIB as libcuda.so.1), and a program that calls it (built without).
 *
 * The program waits for a line on stdin (so that the test can make it
 * visible to the tracer first), calls cuLaunchKernel once, which makes the
 * dynamic linker run the resolver (at that first call: the test links it
 * with -z lazy), prints "resolved", waits for another line and then makes N
 * calls with arguments derived from the call index as exercise.c does.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
	unsigned, CUstream, void **, void **);

#ifdef LIB
static volatile uint64_t calls;

__attribute__((noinline)) static CUresult launch_impl(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
	unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s, void **params, void **extra)
{
	(void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; (void)s;
	(void)params; (void)extra;
	calls++;
	return 0;
}

static launch_fn resolve_launch(void)
{
	return launch_impl;
}

CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
	unsigned, CUstream, void **, void **) __attribute__((ifunc("resolve_launch")));
#else
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
	unsigned bz, unsigned shm, CUstream s, void **params, void **extra);

static uint64_t h(uint64_t i, uint64_t k) { return 0x100000000ULL * (i % 13 + 1) + i * 64 + k * 8; }

int main(int argc, char **argv)
{
	char line[16];
	unsigned long long n = argc > 1 ? strtoull(argv[1], NULL, 10) : 0;
	if (fgets(line, sizeof line, stdin) == NULL)
		return 3;
	cuLaunchKernel(NULL, 0, 0, 0, 0, 0, 0, 0, NULL, NULL, NULL);
	printf("resolved\n");
	fflush(stdout);
	if (fgets(line, sizeof line, stdin) == NULL)
		return 3;
	/* Call indices are those of cuLaunchKernel in exercise.c's rotation. */
	for (unsigned long long j = 0; j < n; j++) {
		uint64_t i = j * 31;
		cuLaunchKernel((CUfunction)h(i, 0), i % 65535 + 1, i % 7 + 1, i % 5 + 1, i % 1024 + 1, i % 3 + 1,
			i % 2 + 1, (i * 16) % 65536, (CUstream)h(i, 1), NULL, NULL);
	}
	return 0;
}
#endif
