/*
 * gpu.c: the emulated GPU that every process using the stub driver on a node
 * shares, one per GPU index, in POSIX shared memory (/arbiter-stubgpu-INDEX,
 * or /arbiter-stubgpu-NODE-INDEX for a named node).
 *
 * The GPU is time-sliced between processes as NVIDIA's scheduler does
 * between channel groups: round-robin among the groups with queued work,
 * each holding the GPU for its timeslice (1024 us by default) or until it
 * runs out of work. A kernel's emulated duration is consumed only while its
 * group holds the GPU.
 *
 * No process runs the schedule: the segment holds the schedule up to some
 * time, and whoever calls into the driver advances it to now, a pure
 * function of the work queued. A process's queued work therefore keeps
 * running while the process is stopped, and a synchronizing call computes
 * when its work will be done from the schedule, sleeps until then and looks
 * again (work queued meanwhile by others can only delay it).
 *
 * There is no lock a process could die or be stopped holding. The schedule
 * is published copy-on-write: each group owns two state buffers; an
 * operation copies the published state into the one not published, checks
 * that nothing was published meanwhile (a seqlock's check), applies itself
 * and publishes with one compare-and-swap on head, which carries a
 * generation so that an outdated copy can never be published. A process
 * stopped or killed midway leaves only its own unpublished buffer behind.
 * A process killed with work queued loses that work, as its channels would
 * on a real GPU: the schedule checks that a group's owner is alive before
 * giving it the GPU, at most every GPU_LIVENESS_NS.
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpu.h"

#define GPU_MAGIC 0x7570676275747361ULL /* "astubgpu" */
#define GPU_VERSION 2
/* How often at most a group's owner is checked for being alive. */
#define GPU_LIVENESS_NS 5000000ULL
/* How long to wait for another process to finish creating a segment
 * before taking it for a leftover and replacing it. */
#define GPU_INIT_WAIT_NS 1000000000ULL
/* Waits sleep until this long before their work is due, then poll. */
#define GPU_SPIN_NS 50000ULL
/* The buffer published when the segment is created; never written again. */
#define GPU_INITIAL (2 * GPU_MAX_GROUPS)
#define GPU_BUFFERS (2 * GPU_MAX_GROUPS + 1)

struct gpu_shm {
	uint64_t magic; /* written last by the creator */
	uint32_t version;
	uint32_t size;
	uint64_t head;                  /* generation << 16 | published buffer */
	uint32_t hw;                    /* slots ever claimed: [0, hw) */
	uint32_t pad;
	int32_t claim[GPU_MAX_GROUPS];  /* pid owning each group slot */
	struct gpu_state buf[GPU_BUFFERS];
};

static uint64_t gpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void gpu_sleep_until(uint64_t t)
{
	struct timespec ts = { .tv_sec = t / 1000000000ULL, .tv_nsec = t % 1000000000ULL };
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* pid_alive says whether pid exists (a process of another user counts). */
static int pid_alive(int32_t pid)
{
	return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH);
}

/* ---- the schedule ---- */

/* lane_room returns how much of lane l's work can run before the schedule
 * must look again (its work ends, or it reaches a wait), and sets *blocked
 * when it waits on another lane. A satisfied wait is cleared. */
static uint64_t lane_room(struct gpu_group *grp, unsigned l, int *blocked)
{
	struct gpu_lane *ln = &grp->lane[l];
	*blocked = 0;
	if (ln->wait_lane < GPU_LANES && ln->done >= ln->wait_pos) {
		if (grp->lane[ln->wait_lane].done >= ln->wait_ticket) {
			ln->wait_lane = GPU_NO_LANE;
		} else {
			*blocked = 1;
			return 0;
		}
	}
	if (ln->done >= ln->submitted)
		return 0;
	uint64_t end = ln->submitted;
	if (ln->wait_lane < GPU_LANES && ln->wait_pos < end)
		end = ln->wait_pos;
	return end - ln->done;
}

/* group_step returns the longest step group grp can run before one of its
 * lanes needs a look (0: it has no runnable work). */
static uint64_t group_step(struct gpu_group *grp)
{
	uint64_t step = 0;
	for (unsigned l = 0; l < GPU_LANES; l++) {
		int blocked;
		uint64_t r = lane_room(grp, l, &blocked);
		if (blocked) {
			/* Look again when the lane it waits on gets there, if
			 * that lane is running. */
			struct gpu_lane *ln = &grp->lane[l];
			int b2;
			if (lane_room(grp, ln->wait_lane, &b2) == 0)
				continue;
			r = ln->wait_ticket - grp->lane[ln->wait_lane].done;
		}
		if (r > 0 && (step == 0 || r < step))
			step = r;
	}
	return step;
}

/* drop_group forgets a dead owner's group: its queued work is lost, as a
 * real GPU's is when the process's channels are torn down. */
static void drop_group(struct gpu_shm *shm, struct gpu_state *s, int i)
{
	int32_t pid = s->group[i].pid;
	memset(&s->group[i], 0, sizeof s->group[i]);
	for (unsigned l = 0; l < GPU_LANES; l++)
		s->group[i].lane[l].wait_lane = GPU_NO_LANE;
	if (shm != NULL)
		__atomic_compare_exchange_n(&shm->claim[i], &pid, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

/* pick gives the GPU to the next group after the current one (round-robin,
 * the current one last) that has work, checking owners for being alive when
 * shm is set. Returns its index or -1. */
static int pick(struct gpu_shm *shm, struct gpu_state *s)
{
	int n = (int)s->ngroups;
	if (n == 0)
		return -1;
	int start = s->current >= 0 && s->current < n ? s->current : n - 1;
	for (int k = 1; k <= n; k++) {
		int i = (start + k) % n;
		struct gpu_group *grp = &s->group[i];
		if (grp->pid == 0 || group_step(grp) == 0)
			continue;
		if (shm != NULL && s->clock - grp->checked_at >= GPU_LIVENESS_NS) {
			if (!pid_alive(grp->pid)) {
				drop_group(shm, s, i);
				continue;
			}
			grp->checked_at = s->clock;
		}
		return i;
	}
	return -1;
}

static int satisfied(const struct gpu_group *grp, const uint64_t *want)
{
	for (unsigned l = 0; l < GPU_LANES; l++)
		if (grp->lane[l].done < want[l])
			return 0;
	return 1;
}

/* advance runs the schedule s up to target. With want set, it stops as
 * soon as every lane l of group watch has done >= want[l] and returns that
 * time (UINT64_MAX if the GPU runs out of work first); otherwise it returns
 * target. shm, when set, lets it check owners for being alive. */
static uint64_t advance(struct gpu_shm *shm, struct gpu_state *s, uint64_t target, int watch, const uint64_t *want)
{
	if (want != NULL && satisfied(&s->group[watch], want))
		return s->clock;
	while (s->clock < target) {
		int cur = s->current;
		uint64_t step = 0;
		if (cur >= 0 && cur < (int)s->ngroups && s->clock < s->slice_end)
			step = group_step(&s->group[cur]);
		if (step == 0) {
			/* The slice is over or its group ran out of work. */
			int next = pick(shm, s);
			if (next < 0) {
				s->current = -1;
				if (want != NULL)
					return UINT64_MAX;
				s->clock = target;
				break;
			}
			if (next != cur)
				s->switches++;
			s->current = cur = next;
			s->slice_end = s->clock + s->group[cur].timeslice_ns;
			step = group_step(&s->group[cur]);
		}
		struct gpu_group *grp = &s->group[cur];
		if (step > s->slice_end - s->clock)
			step = s->slice_end - s->clock;
		if (step > target - s->clock)
			step = target - s->clock;
		/* Rooms first: a lane unblocked during this step must not run in
		 * it. */
		uint64_t room[GPU_LANES];
		for (unsigned l = 0; l < GPU_LANES; l++) {
			int blocked;
			room[l] = lane_room(grp, l, &blocked);
		}
		for (unsigned l = 0; l < GPU_LANES; l++)
			grp->lane[l].done += room[l] < step ? room[l] : step;
		grp->busy_ns += step;
		s->clock += step;
		if (want != NULL && cur == watch && satisfied(grp, want))
			return s->clock;
	}
	return target;
}

/* ---- publishing ---- */

/* sanitize bounds every index a damaged or hostile segment could hold. */
static void sanitize(struct gpu_state *s)
{
	if (s->ngroups > GPU_MAX_GROUPS)
		s->ngroups = GPU_MAX_GROUPS;
	if (s->current < -1 || s->current >= (int)s->ngroups)
		s->current = -1;
	for (unsigned i = 0; i < s->ngroups; i++)
		for (unsigned l = 0; l < GPU_LANES; l++)
			if (s->group[i].lane[l].wait_lane > GPU_NO_LANE)
				s->group[i].lane[l].wait_lane = GPU_NO_LANE;
}

/* copy_state copies the state head h names into out, only the groups in
 * use; false when something was published meanwhile (the copy may be torn
 * and must be retried). */
static int copy_state(struct gpu_shm *shm, uint64_t h, struct gpu_state *out)
{
	unsigned cur = h & 0xffff;
	if (cur >= GPU_BUFFERS)
		cur = GPU_INITIAL; /* a damaged head: start over from empty */
	/* Slots at or above hw were never claimed: zero in every buffer. */
	uint32_t n = __atomic_load_n(&shm->hw, __ATOMIC_ACQUIRE);
	if (n > GPU_MAX_GROUPS)
		n = GPU_MAX_GROUPS;
	memcpy(out, &shm->buf[cur], offsetof(struct gpu_state, group) + n * sizeof out->group[0]);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&shm->head, __ATOMIC_RELAXED) != h)
		return 0;
	out->ngroups = n;
	sanitize(out);
	return 1;
}

/* read_published copies the published schedule into out; returns the head
 * it copied. */
static uint64_t read_published(struct gpu_shm *shm, struct gpu_state *out)
{
	for (;;) {
		uint64_t h = __atomic_load_n(&shm->head, __ATOMIC_ACQUIRE);
		if (copy_state(shm, h, out))
			return h;
	}
}

/* op is one operation on the shared schedule: advance it to now, let fn
 * change it (fn may be NULL) and publish. Called with g->mu held; returns
 * the published buffer, which stays unchanged while g->mu is held. */
static struct gpu_state *op(struct gpu *g, void (*fn)(struct gpu *, struct gpu_state *, void *), void *arg)
{
	struct gpu_shm *shm = g->shm;
	int32_t me = g->pid;
	for (;;) {
		uint64_t h = __atomic_load_n(&shm->head, __ATOMIC_ACQUIRE);
		unsigned cur = h & 0xffff;
		unsigned mine = 2 * g->slot + (cur == 2u * g->slot ? 1 : 0);
		struct gpu_state *s = &shm->buf[mine];
		if (!copy_state(shm, h, s))
			continue;
		struct gpu_group *grp = &s->group[g->slot];
		if (grp->pid != me) {
			/* A group left by a dead process, or a new one. */
			drop_group(NULL, s, g->slot);
			grp->pid = me;
			grp->timeslice_ns = g->timeslice_ns;
		}
		uint64_t now = gpu_now();
		if (now > s->clock)
			advance(shm, s, now, 0, NULL);
		grp->checked_at = s->clock;
		if (fn != NULL)
			fn(g, s, arg);
		uint64_t next = ((h >> 16) + 1) << 16 | mine;
		if (__atomic_compare_exchange_n(&shm->head, &h, next, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			return s;
	}
}

struct submit_arg {
	unsigned lane;
	uint64_t ns;
	uint64_t ticket;
};

static void do_submit(struct gpu *g, struct gpu_state *s, void *p)
{
	struct submit_arg *a = p;
	struct gpu_group *grp = &s->group[g->slot];
	grp->lane[a->lane].submitted += a->ns;
	grp->items++;
	a->ticket = grp->lane[a->lane].submitted;
}

uint64_t gpu_submit(struct gpu *g, unsigned lane, uint64_t ns)
{
	struct submit_arg a = { .lane = lane % GPU_LANES, .ns = ns };
	pthread_mutex_lock(&g->mu);
	op(g, do_submit, &a);
	pthread_mutex_unlock(&g->mu);
	return a.ticket;
}

void gpu_tickets(struct gpu *g, uint64_t t[GPU_LANES])
{
	pthread_mutex_lock(&g->mu);
	struct gpu_state *s = op(g, NULL, NULL);
	for (unsigned l = 0; l < GPU_LANES; l++)
		t[l] = s->group[g->slot].lane[l].submitted;
	pthread_mutex_unlock(&g->mu);
}

struct wait_arg {
	unsigned lane, on;
	uint64_t ticket;
	int busy;
};

static void do_wait_lane(struct gpu *g, struct gpu_state *s, void *p)
{
	struct wait_arg *a = p;
	struct gpu_group *grp = &s->group[g->slot];
	struct gpu_lane *ln = &grp->lane[a->lane];
	int blocked;
	a->busy = 0;
	if (grp->lane[a->on].done >= a->ticket)
		return; /* already there */
	lane_room(grp, a->lane, &blocked); /* clears a satisfied wait */
	if (ln->wait_lane != GPU_NO_LANE) {
		a->busy = 1;
		return;
	}
	ln->wait_pos = ln->submitted;
	ln->wait_lane = a->on;
	ln->wait_ticket = a->ticket;
}

int gpu_wait_lane(struct gpu *g, unsigned lane, unsigned on, uint64_t ticket)
{
	struct wait_arg a = { .lane = lane % GPU_LANES, .on = on % GPU_LANES, .ticket = ticket };
	if (a.lane == a.on)
		return 0; /* a lane runs in order anyway */
	pthread_mutex_lock(&g->mu);
	op(g, do_wait_lane, &a);
	pthread_mutex_unlock(&g->mu);
	return a.busy ? -1 : 0;
}

void gpu_wait(struct gpu *g, const uint64_t want[GPU_LANES])
{
	for (;;) {
		pthread_mutex_lock(&g->mu);
		struct gpu_state *s = op(g, NULL, NULL);
		if (satisfied(&s->group[g->slot], want)) {
			pthread_mutex_unlock(&g->mu);
			return;
		}
		/* When will it be done if nothing more is queued? Work queued
		 * later can only delay it, so this is the earliest time to look
		 * again. */
		memcpy(g->scratch, s, offsetof(struct gpu_state, group) + s->ngroups * sizeof s->group[0]);
		uint64_t due = advance(NULL, g->scratch, UINT64_MAX, g->slot, want);
		pthread_mutex_unlock(&g->mu);
		uint64_t now = gpu_now();
		if (due == UINT64_MAX)
			due = now + 1000000; /* blocked on a wait that nothing feeds */
		if (due > now + GPU_SPIN_NS)
			gpu_sleep_until(due - GPU_SPIN_NS);
		else
			while (gpu_now() < due)
				__builtin_ia32_pause();
	}
}

/* ---- the segment ---- */

int gpu_segment_name(char *out, size_t n, const char *node, int index)
{
	int r = node != NULL && node[0] != '\0' ? snprintf(out, n, "/arbiter-stubgpu-%s-%d", node, index)
	                                          : snprintf(out, n, "/arbiter-stubgpu-%d", index);
	return r < 0 || (size_t)r >= n ? -1 : 0;
}

/* create makes a new segment in name, exclusively. Returns the mapping or
 * NULL with errno (EEXIST when another process made it first). */
static struct gpu_shm *create(const char *name)
{
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0666);
	if (fd < 0)
		return NULL;
	/* Processes of every user on the node share the GPU, as they share a
	 * real one: the creator's umask must not lock the others out. */
	fchmod(fd, 0666);
	struct gpu_shm *shm = MAP_FAILED;
	if (ftruncate(fd, sizeof *shm) == 0)
		shm = mmap(NULL, sizeof *shm, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd);
	if (shm == MAP_FAILED) {
		shm_unlink(name);
		errno = e;
		return NULL;
	}
	shm->version = GPU_VERSION;
	shm->size = sizeof *shm;
	shm->buf[GPU_INITIAL].current = -1;
	shm->buf[GPU_INITIAL].clock = gpu_now();
	for (int i = 0; i < GPU_MAX_GROUPS; i++)
		for (unsigned l = 0; l < GPU_LANES; l++)
			shm->buf[GPU_INITIAL].group[i].lane[l].wait_lane = GPU_NO_LANE;
	__atomic_store_n(&shm->head, (uint64_t)GPU_INITIAL, __ATOMIC_RELEASE);
	__atomic_store_n(&shm->magic, GPU_MAGIC, __ATOMIC_RELEASE);
	return shm;
}

/* open_existing maps the segment in name once its creator has finished.
 * Returns NULL with errno ENOENT when there is none, or ESTALE when it is a
 * leftover that will never be usable (another layout, a creator that died
 * midway). */
static struct gpu_shm *open_existing(const char *name, int writable)
{
	int fd = shm_open(name, writable ? O_RDWR : O_RDONLY, 0);
	if (fd < 0)
		return NULL;
	uint64_t give_up = gpu_now() + GPU_INIT_WAIT_NS;
	struct stat st;
	for (;;) {
		if (fstat(fd, &st) != 0) {
			int e = errno;
			close(fd);
			errno = e;
			return NULL;
		}
		if ((size_t)st.st_size >= sizeof(struct gpu_shm) || gpu_now() > give_up)
			break;
		usleep(1000);
	}
	if ((size_t)st.st_size != sizeof(struct gpu_shm)) {
		close(fd);
		errno = ESTALE;
		return NULL;
	}
	struct gpu_shm *shm = mmap(NULL, sizeof *shm, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd);
	if (shm == MAP_FAILED) {
		errno = e;
		return NULL;
	}
	while (__atomic_load_n(&shm->magic, __ATOMIC_ACQUIRE) != GPU_MAGIC && gpu_now() < give_up)
		usleep(1000);
	if (shm->magic != GPU_MAGIC || shm->version != GPU_VERSION || shm->size != sizeof *shm) {
		munmap(shm, sizeof *shm);
		errno = ESTALE;
		return NULL;
	}
	return shm;
}

/* map opens the segment in name, creating it on first use and replacing a
 * leftover that cannot be used. */
static struct gpu_shm *map(const char *name)
{
	for (int attempt = 0; attempt < 4; attempt++) {
		struct gpu_shm *shm = create(name);
		if (shm != NULL || errno != EEXIST)
			return shm;
		shm = open_existing(name, 1);
		if (shm != NULL)
			return shm;
		if (errno == ESTALE)
			shm_unlink(name);
		else if (errno != ENOENT)
			return NULL;
	}
	errno = EAGAIN;
	return NULL;
}

/* claim takes the first group slot that is free or whose owner has died
 * (the lowest, so that operations copy as few groups as they can). */
static int claim(struct gpu_shm *shm, int32_t me)
{
	for (int i = 0; i < GPU_MAX_GROUPS; i++) {
		int32_t owner = __atomic_load_n(&shm->claim[i], __ATOMIC_ACQUIRE);
		if (owner != 0 && owner != me && pid_alive(owner))
			continue;
		if (!__atomic_compare_exchange_n(&shm->claim[i], &owner, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			continue;
		uint32_t hw = __atomic_load_n(&shm->hw, __ATOMIC_ACQUIRE);
		while (hw < (uint32_t)i + 1 &&
		       !__atomic_compare_exchange_n(&shm->hw, &hw, i + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			;
		return i;
	}
	return -1;
}

/* do_join starts this process's group afresh: a slot still claimed under
 * this pid can only be left from an earlier process that had it. */
static void do_join(struct gpu *g, struct gpu_state *s, void *arg)
{
	(void)arg;
	drop_group(NULL, s, g->slot);
	s->group[g->slot].pid = g->pid;
	s->group[g->slot].timeslice_ns = g->timeslice_ns;
	s->group[g->slot].checked_at = s->clock;
}

int gpu_attach(struct gpu *g, const char *node, int index, uint64_t timeslice_ns, char *err, size_t errlen)
{
	memset(g, 0, sizeof *g);
	g->index = index;
	g->slot = -1;
	g->timeslice_ns = timeslice_ns ? timeslice_ns : GPU_DEFAULT_TIMESLICE_NS;
	pthread_mutex_init(&g->mu, NULL);
	if (gpu_segment_name(g->name, sizeof g->name, node, index) != 0) {
		snprintf(err, errlen, "GPU %d of node \"%s\": the name is too long", index, node);
		return -1;
	}
	g->scratch = malloc(sizeof *g->scratch);
	if (g->scratch == NULL) {
		snprintf(err, errlen, "GPU %d: out of memory", index);
		return -1;
	}
	g->shm = map(g->name);
	if (g->shm == NULL) {
		snprintf(err, errlen, "open the shared emulated GPU %d (/dev/shm%s): %s; remove a leftover with rm /dev/shm%s",
			index, g->name, strerror(errno), g->name);
		free(g->scratch);
		return -1;
	}
	g->pid = getpid();
	g->slot = claim(g->shm, g->pid);
	if (g->slot < 0) {
		snprintf(err, errlen, "the shared emulated GPU %d (/dev/shm%s) already serves %d live processes, its limit",
			index, g->name, GPU_MAX_GROUPS);
		munmap(g->shm, sizeof *g->shm);
		free(g->scratch);
		return -1;
	}
	pthread_mutex_lock(&g->mu);
	op(g, do_join, NULL);
	pthread_mutex_unlock(&g->mu);
	return 0;
}

static void do_leave(struct gpu *g, struct gpu_state *s, void *arg)
{
	(void)arg;
	drop_group(NULL, s, g->slot);
}

void gpu_leave(struct gpu *g)
{
	if (g->shm == NULL || g->slot < 0)
		return;
	pthread_mutex_lock(&g->mu);
	op(g, do_leave, NULL);
	int32_t me = g->pid;
	__atomic_compare_exchange_n(&g->shm->claim[g->slot], &me, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
	g->slot = -1;
	pthread_mutex_unlock(&g->mu);
}

void gpu_forget(struct gpu *g)
{
	if (g->shm != NULL)
		munmap(g->shm, sizeof *g->shm);
	free(g->scratch);
	memset(g, 0, sizeof *g);
	g->slot = -1;
}

int gpu_read(const char *name, struct gpu_state *out)
{
	struct gpu_shm *shm = open_existing(name, 0);
	if (shm == NULL)
		return -1;
	read_published(shm, out);
	sanitize(out);
	munmap(shm, sizeof *shm);
	uint64_t now = gpu_now();
	if (now > out->clock)
		advance(NULL, out, now, 0, NULL);
	return 0;
}
