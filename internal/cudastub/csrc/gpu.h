/*
 * gpu.h: the emulated GPU that every process using the stub driver on a node
 * shares, one per GPU index (gpu.c).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef CUDASTUB_GPU_H
#define CUDASTUB_GPU_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum {
	/* Processes (channel groups) one emulated GPU holds at once. */
	GPU_MAX_GROUPS = 64,
	/* Work queues per process: the streams of a process map onto its
	 * lanes; lanes run concurrently while the process holds the GPU, the
	 * work of one lane runs in order. */
	GPU_LANES = 8,
	GPU_NO_LANE = GPU_LANES,
};

/* The default timeslice of a channel group, as on NVIDIA GPUs. */
#define GPU_DEFAULT_TIMESLICE_NS 1024000ULL

/* A lane counts work in nanoseconds of emulated GPU time: everything queued
 * (submitted) and everything executed (done). A call's work is complete when
 * done reaches the submitted count it left, its ticket. */
struct gpu_lane {
	uint64_t submitted;
	uint64_t done;
	/* A wait on another lane of the group (cuStreamWaitEvent): once done
	 * reaches wait_pos, the lane runs on only after lane wait_lane's done
	 * reaches wait_ticket. wait_lane is GPU_NO_LANE when there is none. */
	uint64_t wait_pos;
	uint64_t wait_ticket;
	uint32_t wait_lane;
	uint32_t pad;
};

/* A process's channel group on the GPU. */
struct gpu_group {
	int32_t pid; /* 0: free */
	uint32_t pad;
	uint64_t timeslice_ns;
	uint64_t checked_at; /* timeline time the owner was last seen alive */
	uint64_t busy_ns;    /* GPU time the group has used */
	uint64_t items;      /* launches, copies and markers submitted */
	struct gpu_lane lane[GPU_LANES];
};

/* The GPU's schedule up to clock (CLOCK_MONOTONIC ns). */
struct gpu_state {
	uint64_t clock;
	uint64_t slice_end; /* when the current group's timeslice ends */
	int32_t current;    /* the group holding the GPU, -1 when idle */
	uint32_t ngroups;   /* groups that may be in use: [0, ngroups) */
	uint64_t switches; /* times the GPU changed hands */
	struct gpu_group group[GPU_MAX_GROUPS];
};

struct gpu_shm;

/* gpu is one process's attachment to one emulated GPU. */
struct gpu {
	int index;
	char name[96]; /* the shared memory object, /arbiter-stubgpu-... */
	struct gpu_shm *shm;
	int slot;                  /* this process's group */
	int32_t pid;               /* this process */
	uint64_t timeslice_ns;     /* its timeslice */
	pthread_mutex_t mu;        /* one operation at a time in this process */
	struct gpu_state *scratch; /* private copy for predictions */
};

/* gpu_segment_name writes the shared memory name of GPU index on node
 * ("" is the default node) to out; -1 if it does not fit. */
int gpu_segment_name(char *out, size_t n, const char *node, int index);

/* gpu_attach opens (creating on first use) the shared GPU index of node and
 * claims a group for this process. On failure it returns -1 with a message
 * in err. */
int gpu_attach(struct gpu *g, const char *node, int index, uint64_t timeslice_ns, char *err, size_t errlen);

/* gpu_submit queues ns of work on lane and returns the lane's ticket. */
uint64_t gpu_submit(struct gpu *g, unsigned lane, uint64_t ns);

/* gpu_tickets stores every lane's current ticket in t. */
void gpu_tickets(struct gpu *g, uint64_t t[GPU_LANES]);

/* gpu_wait_lane makes lane wait, from here on, until lane on reaches ticket.
 * Returns -1 when the lane already holds a wait: the caller must then wait
 * on the host instead. */
int gpu_wait_lane(struct gpu *g, unsigned lane, unsigned on, uint64_t ticket);

/* gpu_wait blocks until every lane l has done >= want[l]. */
void gpu_wait(struct gpu *g, const uint64_t want[GPU_LANES]);

/* gpu_leave gives up this process's group (at exit): its queued work is
 * dropped, as a real GPU drops an exiting process's. */
void gpu_leave(struct gpu *g);

/* gpu_forget drops the attachment in a forked child, which must claim a
 * group of its own. */
void gpu_forget(struct gpu *g);

/* gpu_read copies the schedule of the GPU in name, advanced to now, without
 * joining it. Returns -1 with errno set when it cannot. */
int gpu_read(const char *name, struct gpu_state *out);

#endif
