/*
 * stubgpu.c: shows, or removes, the emulated GPU that the stub driver's
 * processes share (gpu.c).
 *
 *   stubgpu [--node NAME] [--gpu INDEX]           print the GPU's schedule,
 *                                                 advanced to now, as JSON
 *   stubgpu [--node NAME] [--gpu INDEX] --remove  remove its shared memory
 *
 * One JSON line on stdout:
 *   {"gpu":0,"segment":"/dev/shm/arbiter-stubgpu-0","clock_ns":...,
 *    "current_pid":123,"switches":456,"groups":[{"pid":123,"alive":true,
 *    "timeslice_us":1024,"queued_ns":0,"busy_ns":...,"items":...}]}
 * queued_ns is the group's work not yet run. --node defaults to
 * $ARBITER_STUB_NODE. Exit status 1 when the GPU has never been used (or
 * cannot be read), 2 for bad usage.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gpu.h"

static void usage(void)
{
	fprintf(stderr, "usage: stubgpu [--node NAME] [--gpu INDEX] [--remove]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *node = getenv("ARBITER_STUB_NODE");
	long index = 0;
	int remove = 0;
	static const struct option opts[] = {
		{ "node", required_argument, NULL, 'n' },
		{ "gpu", required_argument, NULL, 'g' },
		{ "remove", no_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		char *end;
		switch (c) {
		case 'n': node = optarg; break;
		case 'g':
			errno = 0;
			index = strtol(optarg, &end, 10);
			if (end == optarg || *end != '\0' || errno != 0 || index < 0 || index > 255) {
				fprintf(stderr, "stubgpu: --gpu: want a GPU index from 0 to 255, got \"%s\"\n", optarg);
				exit(2);
			}
			break;
		case 'r': remove = 1; break;
		default: usage();
		}
	}
	if (optind != argc)
		usage();

	char name[96];
	if (gpu_segment_name(name, sizeof name, node, (int)index) != 0) {
		fprintf(stderr, "stubgpu: --node \"%s\" is too long\n", node);
		return 2;
	}
	if (remove) {
		if (shm_unlink(name) != 0 && errno != ENOENT) {
			fprintf(stderr, "stubgpu: remove /dev/shm%s: %s\n", name, strerror(errno));
			return 1;
		}
		return 0;
	}
	struct gpu_state *s = malloc(sizeof *s);
	if (s == NULL) {
		fprintf(stderr, "stubgpu: out of memory\n");
		return 1;
	}
	if (gpu_read(name, s) != 0) {
		if (errno == ENOENT)
			fprintf(stderr, "stubgpu: GPU %ld has not been used (no /dev/shm%s)\n", index, name);
		else
			fprintf(stderr, "stubgpu: read GPU %ld (/dev/shm%s): %s\n", index, name, strerror(errno));
		return 1;
	}
	int current = s->current >= 0 ? s->group[s->current].pid : 0;
	printf("{\"gpu\":%ld,\"segment\":\"/dev/shm%s\",\"clock_ns\":%llu,\"current_pid\":%d,\"switches\":%llu,\"groups\":[",
		index, name, (unsigned long long)s->clock, current, (unsigned long long)s->switches);
	const char *sep = "";
	for (unsigned i = 0; i < s->ngroups; i++) {
		struct gpu_group *g = &s->group[i];
		if (g->pid == 0)
			continue;
		unsigned long long queued = 0;
		for (int l = 0; l < GPU_LANES; l++)
			queued += g->lane[l].submitted - g->lane[l].done;
		int alive = kill(g->pid, 0) == 0 || errno != ESRCH;
		printf("%s{\"pid\":%d,\"alive\":%s,\"timeslice_us\":%llu,\"queued_ns\":%llu,\"busy_ns\":%llu,\"items\":%llu}",
			sep, g->pid, alive ? "true" : "false", (unsigned long long)g->timeslice_ns / 1000, queued,
			(unsigned long long)g->busy_ns, (unsigned long long)g->items);
		sep = ",";
	}
	printf("]}\n");
	return 0;
}
