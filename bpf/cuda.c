//go:build ignore

// CUDA driver API capture: entry uprobes on the launch, copy and sync
// families of libcuda, return probes on the synchronizers, and the process
// exec/exit raw tracepoints. Every event is one fixed-size struct event in one
// ring buffer.
//
// The launch probes also close the launch gate: a process listed in
// launch_gate is stopped with SIGSTOP at its next launch.
//
// Every uprobe program exists twice (PROGRAMS below): for uprobe_multi
// links and for single perf-event uprobes on kernels before 6.6.
//
// The Func id of each attach point arrives through the BPF cookie
// (UprobeOptions.Cookie, kernel 5.15+: bits 0-7 the trace.Func, bits 8-15
// its trace.Kind), so one program serves every variant (_v2, _ptsz, _ptds)
// of a family that shares an argument layout.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

// "Dual BSD/GPL": bpf_probe_read_user, bpf_probe_read_kernel (behind
// BPF_CORE_READ) and bpf_get_current_task are GPL-only helpers; the kernel
// refuses them to programs without a GPL-compatible licence.
char __license[] SEC("license") = "Dual BSD/GPL";

// Register file seen by a uprobe, per target architecture. Defined here
// rather than taken from vmlinux.h so one source compiles for both targets
// without the kernel's headers, and so the 6th and later arguments (absent
// from older libbpf's PT_REGS_PARM macros) are reachable.
#if defined(__TARGET_ARCH_x86)
struct regs {
	__u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	__u64 ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};
#define ARG1(r) ((r)->di)
#define ARG2(r) ((r)->si)
#define ARG3(r) ((r)->dx)
#define ARG4(r) ((r)->cx)
#define ARG5(r) ((r)->r8)
#define ARG6(r) ((r)->r9)
#define RET(r) ((r)->ax)
#define SP(r) ((r)->sp)
// Arguments past the 6th are on the stack above the return address: the
// 7th at SP+8 at function entry (the probe fires before the prologue runs).
#define REG_ARGS 6
#define STACK_ARG_BASE 8
#elif defined(__TARGET_ARCH_arm64)
struct regs {
	__u64 regs[31];
	__u64 sp, pc, pstate;
};
#define ARG1(r) ((r)->regs[0])
#define ARG2(r) ((r)->regs[1])
#define ARG3(r) ((r)->regs[2])
#define ARG4(r) ((r)->regs[3])
#define ARG5(r) ((r)->regs[4])
#define ARG6(r) ((r)->regs[5])
#define ARG7(r) ((r)->regs[6])
#define ARG8(r) ((r)->regs[7])
#define RET(r) ((r)->regs[0])
#define SP(r) ((r)->sp)
// AAPCS64: x0-x7 carry the first 8 arguments; the 9th and later are in
// 8-byte slots from SP upwards (the return address is in x30, not on the
// stack).
#define REG_ARGS 8
#define STACK_ARG_BASE 0
#else
#error "unsupported target architecture: build with bpf2go -target amd64,arm64"
#endif

// PROGRAMS defines a probe body's two entry points: NAME for a single
// perf-event uprobe and NAME_multi for an uprobe_multi link (kernel 6.6+),
// which attaches one program at every site of a library with one link and
// detaches them all after a single grace period instead of one per site.
#define PROGRAMS(sec, name)                                                     \
	SEC(sec) int name(struct regs *r) { return name##_body(r); }            \
	SEC(sec ".multi") int name##_multi(struct regs *r) { return name##_body(r); }

// Event kinds and the Func ids this program needs by name; the values are
// trace.Kind and trace.Func (the Go side checks them in a test).
enum {
	KIND_LAUNCH = 1,
	KIND_COPY = 2,
	KIND_SYNC = 3,
	KIND_EXEC = 4,
	KIND_EXIT = 5,
	// Internal to the tracer, never a trace.Kind: an IFUNC resolver
	// returned, args[0] is the implementation's address in the process.
	KIND_IFUNC = 0x80,
};

// event is the one record of the ring buffer. Fields by kind:
//   launch: args[0] function (or graph exec), args[1] stream,
//           dims[0..2] grid, dims[3..5] block, dims[6] shared memory bytes
//   copy:   args[0..3] the call's first four arguments as passed; the
//           reader maps them to device/host/bytes/stream by Func
//   sync:   args[0] handle, args[1] second handle, args[2] duration ns,
//           result the returned CUresult
//   exec:   args[0..1] comm (16 bytes), dims[0] parent tgid
//   exit:   args[0..1] comm, result the exit code
// time is the entry time (bpf_ktime_get_ns) of the call.
struct event {
	__u64 time;
	__u64 cgroup;
	__u64 args[4];
	__u32 pid;
	__u32 tid;
	__u32 dims[7];
	__s32 result;
	__u8 kind;
	__u8 func;
	__u8 pad[6];
};

// Referenced so that the type is in BTF (bpf2go -type event) although it is
// only ever reached through bpf_ringbuf_reserve.
const struct event *unused_event __attribute__((unused));

// Filter modes (filter_mode).
enum {
	FILTER_ALL = 0,
	FILTER_LISTED = 1,
};

// Set by the loader before load (spec.Variables).
const volatile __u8 filter_mode = FILTER_ALL;
// The uprobe programs' own filter mode: FILTER_ALL where the kernel already
// runs them only in the listed processes (the probes are attached per
// process: a PID list without cgroups), so that they do not look up again
// what the kernel has checked; filter_mode otherwise. The exec and exit
// tracepoints always follow filter_mode.
const volatile __u8 uprobe_filter_mode = FILTER_ALL;
// The reader is woken only when more than this many bytes wait in the ring;
// below it, records are submitted with BPF_RB_NO_WAKEUP and the reader finds
// them when its poll deadline expires. 0 wakes on every record.
const volatile __u64 wakeup_bytes = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);
} events SEC(".maps");

// Reserve failures (a full ring), per CPU so the count costs no atomics.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

// Processes (tgid) and cgroup v2 ids traced in FILTER_LISTED mode.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u8);
} filter_tgids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u64);
	__type(value, __u8);
} filter_cgroups SEC(".maps");

// Expedited processes (tgid): those whose requests the daemon must see at
// once, the latency-critical ones (Tracer.Expedite). Below the fill
// threshold the reader finds a record only when its poll deadline expires
// (about 10 ms), and the engine preempts best-effort work for a request
// only once its first call arrives. The value is when the process was last
// busy: the entry of its latest launch or copy, or the return of its
// latest synchronizer. A launch or copy at least expedite_gap_ns after that
// opens a request, and its record wakes the reader. Entries of exited
// processes are dropped in sched_exit.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u64);
} expedite SEC(".maps");

// Nonzero while expedite may hold a process (the tracer sets it): until
// then the probes skip its lookup, so that a node without expedited
// processes pays nothing for it.
volatile __u32 expedite_listed = 0;

// Set by the loader: the engine's idle gap. 0 wakes the reader at every
// launch and copy of an expedited process.
const volatile __u64 expedite_gap_ns = 0;

// A synchronizer's entry, kept from its entry probe until its return probe
// (the same thread), which emits the event. active is cleared at the
// return, so that a return without a recorded entry (probes attached
// mid-call) reports nothing.
struct sync_entry {
	__u64 time;
	__u64 handle;
	__u64 other;
	__u8 func;
	__u8 active;
};

// The entry is kept in a slot of a plain array, chosen by thread id: the
// lookup is a few instructions the verifier inlines, where a hash keyed by
// thread cost a hash and an LRU update at each end and task-local storage
// a helper call with its locking at each end (together 1.3x the empty
// entry+return pair on cheap traps, see docs/benchmarks.md). A thread
// claims the slot with a compare-and-swap of owner (its pid_tgid; 0 when
// free) and frees it at its return. Where another thread in a call holds
// the slot (thread ids equal modulo the slot count), the entry goes to the
// thread's task-local storage instead (5.11+). Slots are one cache line
// each, so threads on different CPUs never share one. A thread that exits
// inside a call frees its slot in sched_exit.
struct sync_slot {
	__u64 owner;
	struct sync_entry e;
	__u8 pad[24];
};

// The slot count is a power of two (the loader may shrink it, with
// sync_slot_mask, to make collisions certain in a test).
#define SYNC_SLOTS 8192
const volatile __u32 sync_slot_mask = SYNC_SLOTS - 1;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SYNC_SLOTS);
	__type(key, __u32);
	__type(value, struct sync_slot);
} sync_slots SEC(".maps");

// Where another thread holds a thread's slot, the entry goes to the
// thread's own task-local storage, freed with the thread, so nothing ages
// out or leaks.
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sync_entry);
} sync_entries SEC(".maps");

// The launch gate (enforcement level "gate"): processes, by tgid, that a
// launch probe stops with SIGSTOP at their next kernel launch. An entry
// holds the process's start time, so that a later process reusing the pid
// is never stopped, and whether a probe has stopped it, so that opening
// the gate continues only a process the gate itself stopped. Pinned by
// name (the loader chooses the directory): the entries outlive a killed
// daemon, and the next one, or `arbiter recover`, finds them.
struct gate_entry {
	// The start time of the process (its thread-group leader) in ns after
	// boot, counted as /proc/PID/stat field 22 counts it (start_boottime)
	// and truncated to that field's clock ticks.
	__u64 start;
	// Set to 1 by the probe that stopped the process.
	__u32 stopped;
	// Where an armed request closed the gate (close_armed): when, in
	// units of 1,024 ns of CLOCK_MONOTONIC, truncated to 32 bits, with the
	// lowest bit set so that it is never 0; 0 where the daemon closed it.
	// It tells a gate closed by a request whose first call may not have
	// reached the daemon yet from one the daemon failed to take over
	// (Gate.Settle). Builds that called this field padding wrote 0 here.
	__u32 armed_at;
};

// Referenced so that the type is in BTF (bpf2go -type gate_entry).
const struct gate_entry *unused_gate_entry __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct gate_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} launch_gate SEC(".maps");

// The stops the gate has made and no opener has undone yet: tgid to the
// process's start time (as gate_entry.start). A probe writes the record
// before it sends SIGSTOP (see gate); an opener that finds the entry
// marked stopped writes it again before it deletes the entry (an earlier
// opener may have deleted the record of a later stop), and deletes it
// only after its SIGCONT has gone out. So a process the gate stopped is,
// at every moment, named stopped by its entry or listed here: an opener
// killed between deleting the entry and continuing the process leaves the
// record, and the fresh entry an armed request may write afterwards (not
// marked stopped) hides nothing. Pinned by name beside launch_gate, for
// the same reason.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} gate_stops SEC(".maps");

// Gates armed ahead of the daemon, by latency-critical process (tgid):
// the launch or copy that opens one of its requests (see expedite) closes
// the gates of the processes listed here at once, in the kernel, so that
// a best-effort process is stopped at its next launch without waiting for
// the daemon to read the request's first call (hundreds of microseconds,
// in which it may submit another kernel). The daemon lists the victims it
// would gate for that request, and opens the gates itself when the
// request ends. Not pinned: arming dies with the daemon (its links go
// with it too), and what it closed stays in launch_gate, where the next
// daemon or `arbiter recover` finds it.
#define ARMED_MAX 16

struct armed_victim {
	__u32 tgid;
	__u32 pad;
	// As gate_entry.start.
	__u64 start;
};

struct armed {
	// How many of victims are set.
	__u32 n;
	// Nonzero: only a kernel launch opens a request here, not a copy (the
	// daemon preempts at a request's first launch when its policy gives
	// no pre-preemption hint).
	__u32 launch_only;
	struct armed_victim victims[ARMED_MAX];
};

// Referenced so that the type is in BTF (bpf2go -type armed).
const struct armed *unused_armed __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct armed);
} gate_armed SEC(".maps");

// Signals the gate sent (index 0) and failed to send or, with no room to
// record the stop, did not send (index 1), and gates closed by an armed
// request (index 2), per CPU.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__type(value, __u64);
} gate_signals SEC(".maps");

// Set by the loader: 0 leaves the gate out of the launch probes (the
// probe-cost benchmark's baseline); the verifier then drops its code.
const volatile __u8 gate_enabled = 1;

// traced_tgid is traced for a uprobe that needs no cgroup id of its own:
// the id is fetched only when the process is not listed by tgid.
static __always_inline int traced_tgid(__u32 tgid)
{
	if (uprobe_filter_mode == FILTER_ALL)
		return 1;
	if (bpf_map_lookup_elem(&filter_tgids, &tgid))
		return 1;
	__u64 cgroup = bpf_get_current_cgroup_id();
	return bpf_map_lookup_elem(&filter_cgroups, &cgroup) != 0;
}

// listed is whether a process is in the filter maps.
static __always_inline int listed(__u32 tgid, __u64 cgroup)
{
	if (bpf_map_lookup_elem(&filter_tgids, &tgid))
		return 1;
	return bpf_map_lookup_elem(&filter_cgroups, &cgroup) != 0;
}

// traced is the exec and exit tracepoints' filter.
static __always_inline int traced(__u32 tgid, __u64 cgroup)
{
	return filter_mode == FILTER_ALL || listed(tgid, cgroup);
}

// uprobe_traced is the uprobe programs' filter.
static __always_inline int uprobe_traced(__u32 tgid, __u64 cgroup)
{
	return uprobe_filter_mode == FILTER_ALL || listed(tgid, cgroup);
}

static __always_inline void count_drop(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&drops, &zero);
	if (n)
		*n += 1;
}

// reserve returns a zeroed record with the common header filled in, or NULL
// (counted as a drop) when the ring is full.
static __always_inline struct event *reserve(__u64 pid_tgid, __u64 cgroup, __u8 kind, __u64 cookie)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop();
		return NULL;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->pid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->cgroup = cgroup;
	e->kind = kind;
	e->func = (__u8)cookie;
	return e;
}

// submit queues a record; it wakes the reader where wake is set or past
// the fill threshold.
static __always_inline void submit(struct event *e, int wake)
{
	__u64 flags = BPF_RB_NO_WAKEUP;
	if (wake || bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit(e, flags);
}

// close_armed closes the gates armed for tgid's requests (see
// gate_armed). An entry that exists is left as it is: closed already, and
// perhaps marked stopped.
static __always_inline void close_armed(__u32 tgid, __u64 time, int launch)
{
	if (!gate_enabled)
		return;
	struct armed *a = bpf_map_lookup_elem(&gate_armed, &tgid);
	if (!a || (a->launch_only && !launch))
		return;
	__u32 n = a->n;
	__u64 closed = 0;
	for (int i = 0; i < ARMED_MAX; i++) {
		if (i >= n)
			break;
		struct gate_entry g = { .start = a->victims[i].start, .armed_at = (__u32)(time >> 10) | 1 };
		if (bpf_map_update_elem(&launch_gate, &a->victims[i].tgid, &g, BPF_NOEXIST) == 0)
			closed++;
	}
	__u32 slot = 2;
	__u64 *c = bpf_map_lookup_elem(&gate_signals, &slot);
	if (c)
		*c += closed;
}

// opens_request is whether a launch (launch set) or copy at time opens a
// request of an expedited process (see expedite); it notes the process
// busy, and closes the gates armed for the request. Threads of one
// process race on the time without harm: a later time written first
// makes the other's difference negative, not a wake-up.
static __always_inline int opens_request(__u32 tgid, __u64 time, int launch)
{
	if (!expedite_listed)
		return 0;
	__u64 *busy = bpf_map_lookup_elem(&expedite, &tgid);
	if (!busy)
		return 0;
	__s64 idle = time - *busy;
	*busy = time;
	if (idle < (__s64)expedite_gap_ns)
		return 0;
	close_armed(tgid, time, launch);
	return 1;
}

// ends_call notes an expedited process busy until now, the return of a
// synchronizer.
static __always_inline void ends_call(__u32 tgid, __u64 now)
{
	if (!expedite_listed)
		return;
	__u64 *busy = bpf_map_lookup_elem(&expedite, &tgid);
	if (busy && (__s64)(now - *busy) > 0)
		*busy = now;
}

// Kernel types read with CO-RE; field offsets are relocated against the
// running kernel's BTF.
struct signal_struct {
	struct {
		int counter;
	} live;
} __attribute__((preserve_access_index));

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup {
	struct kernfs_node *kn;
} __attribute__((preserve_access_index));

struct css_set {
	struct cgroup *dfl_cgrp;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct css_set *cgroups;
	int exit_code;
	__u64 start_boottime;
	struct task_struct *real_parent;
	struct task_struct *group_leader;
	struct signal_struct *signal;
} __attribute__((preserve_access_index));

// The uprobe programs read the thread's ids from the task that
// bpf_get_current_task_btf returns (5.11+) with plain loads, which the
// verifier allows on that pointer, instead of calling
// bpf_get_current_pid_tgid and bpf_get_current_cgroup_id: one call in
// place of two, and the cgroup without the helper's RCU section. About
// 60 ns less per probe on the development guest (docs/benchmarks.md).

// current_pid_tgid is bpf_get_current_pid_tgid, read from the task.
static __always_inline __u64 current_pid_tgid(struct task_struct *t)
{
	return (__u64)t->tgid << 32 | (__u32)t->pid;
}

// current_cgroup is bpf_get_current_cgroup_id, read from the task: the id
// of its cgroup on the unified (v2) hierarchy.
static __always_inline __u64 current_cgroup(struct task_struct *t)
{
	return t->cgroups->dfl_cgrp->kn->id;
}

// Linux's SIGSTOP on every architecture Arbiter builds for.
#define SIGSTOP 19
// The length of one clock tick of /proc/PID/stat (USER_HZ is 100).
#define TICK_NS 10000000ULL

// gate stops the current process if its gate is closed: an entry exists
// with the process's start time. The entry is marked stopped by an update
// that fails where the entry is gone, atomic with the delete that opens
// the gate: a probe racing an opening gate either marks the entry before
// the delete (the opener then continues the process, once the probes in
// flight have finished) or stops nothing; a probe that finds the entry
// marked already (another thread is stopping the process) marks it again,
// for that check, since the element it looked up may have been deleted
// and reused for another process meanwhile. Every probe that goes on to
// stop the process then writes the stop's record in gate_stops, and
// stops nothing where it cannot: an entry marked stopped without a stop
// only earns a running process a SIGCONT. bpf_send_signal signals the
// whole thread group; the calling thread stops before the launch reaches
// the driver.
static __always_inline void gate(__u32 tgid)
{
	if (!gate_enabled)
		return;
	struct gate_entry *g = bpf_map_lookup_elem(&launch_gate, &tgid);
	if (!g)
		return;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 start = BPF_CORE_READ(task, group_leader, start_boottime);
	if (start - start % TICK_NS != g->start)
		return;
	struct gate_entry stopped = { .start = g->start, .stopped = 1, .armed_at = g->armed_at };
	if (bpf_map_update_elem(&launch_gate, &tgid, &stopped, BPF_EXIST) != 0)
		return;
	__u32 slot = 1;
	if (bpf_map_update_elem(&gate_stops, &tgid, &stopped.start, BPF_ANY) == 0)
		slot = bpf_send_signal(SIGSTOP) == 0 ? 0 : 1;
	__u64 *n = bpf_map_lookup_elem(&gate_signals, &slot);
	if (n)
		*n += 1;
}

#if !defined(__TARGET_ARCH_x86)
// stack_arg reads the n-th (1-based) argument that the calling convention
// passes on the stack.
static __always_inline __u64 stack_arg(struct regs *r, int n)
{
	__u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)(SP(r) + STACK_ARG_BASE + 8 * (n - REG_ARGS - 1)));
	return v;
}
#endif

// launch_stack_args fills the launch record's fields that come from
// cuLaunchKernel's 7th to 9th arguments (blockZ, sharedMemBytes, hStream).
// On x86-64 all three are on the stack, next to each other, and are read
// with one copy: each bpf_probe_read_user is a helper call with a fault
// handler around it, the dearest step of the launch probe when taken three
// times. On arm64 only the 9th is on the stack.
static __always_inline void launch_stack_args(struct regs *r, struct event *e)
{
#if defined(__TARGET_ARCH_x86)
	__u64 st[3] = {};
	bpf_probe_read_user(st, sizeof(st), (void *)(SP(r) + STACK_ARG_BASE));
	e->dims[5] = st[0];
	e->dims[6] = st[1];
	e->args[1] = st[2];
#else
	e->dims[5] = ARG7(r);
	e->dims[6] = ARG8(r);
	e->args[1] = stack_arg(r, 9);
#endif
}

// cuLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ,
//                sharedMemBytes, hStream, kernelParams, extra)
// and cuLaunchCooperativeKernel (same first nine arguments), with their
// _ptsz forms.
static __always_inline int uprobe_launch_body(struct regs *r)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 pid_tgid = current_pid_tgid(task);
	gate(pid_tgid >> 32);
	__u64 cgroup = current_cgroup(task);
	if (!uprobe_traced(pid_tgid >> 32, cgroup))
		return 0;
	__u64 time = bpf_ktime_get_ns();
	struct event *e = reserve(pid_tgid, cgroup, KIND_LAUNCH, bpf_get_attach_cookie(r));
	if (!e)
		return 0;
	e->time = time;
	e->args[0] = ARG1(r);
	e->dims[0] = ARG2(r);
	e->dims[1] = ARG3(r);
	e->dims[2] = ARG4(r);
	e->dims[3] = ARG5(r);
	e->dims[4] = ARG6(r);
	launch_stack_args(r, e);
	submit(e, opens_request(pid_tgid >> 32, time, 1));
	return 0;
}

PROGRAMS("uprobe", uprobe_launch)

// The leading part of CUlaunchConfig (cuda.h): seven unsigned ints, then the
// stream at offset 32.
struct launch_config {
	__u32 dims[7];
	__u32 pad;
	__u64 stream;
};

// cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
//                  void **kernelParams, void **extra) and its _ptsz form.
static __always_inline int uprobe_launch_ex_body(struct regs *r)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 pid_tgid = current_pid_tgid(task);
	gate(pid_tgid >> 32);
	__u64 cgroup = current_cgroup(task);
	if (!uprobe_traced(pid_tgid >> 32, cgroup))
		return 0;
	__u64 time = bpf_ktime_get_ns();
	struct event *e = reserve(pid_tgid, cgroup, KIND_LAUNCH, bpf_get_attach_cookie(r));
	if (!e)
		return 0;
	struct launch_config cfg = {};
	if (bpf_probe_read_user(&cfg, sizeof(cfg), (void *)ARG1(r)) == 0) {
		__builtin_memcpy(e->dims, cfg.dims, sizeof(e->dims));
		e->args[1] = cfg.stream;
	}
	e->time = time;
	e->args[0] = ARG2(r);
	submit(e, opens_request(pid_tgid >> 32, time, 1));
	return 0;
}

PROGRAMS("uprobe", uprobe_launch_ex)

// Copies (cuMemcpyHtoD*, cuMemcpyDtoH*) and cuGraphLaunch: the first four
// register arguments as passed; the reader knows each Func's layout.
static __always_inline int uprobe_args_body(struct regs *r)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 pid_tgid = current_pid_tgid(task);
	__u64 cookie = bpf_get_attach_cookie(r);
	if ((__u8)(cookie >> 8) == KIND_LAUNCH)
		gate(pid_tgid >> 32);
	__u64 cgroup = current_cgroup(task);
	if (!uprobe_traced(pid_tgid >> 32, cgroup))
		return 0;
	__u64 time = bpf_ktime_get_ns();
	struct event *e = reserve(pid_tgid, cgroup, (__u8)(cookie >> 8), cookie);
	if (!e)
		return 0;
	e->time = time;
	e->args[0] = ARG1(r);
	e->args[1] = ARG2(r);
	e->args[2] = ARG3(r);
	e->args[3] = ARG4(r);
	submit(e, opens_request(pid_tgid >> 32, time, (__u8)(cookie >> 8) == KIND_LAUNCH));
	return 0;
}

PROGRAMS("uprobe", uprobe_args)

// Synchronizers: the entry keeps the time and handles until the return.
static __always_inline int uprobe_sync_body(struct regs *r)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 pid_tgid = current_pid_tgid(task);
	if (!traced_tgid(pid_tgid >> 32))
		return 0;
	__u64 time = bpf_ktime_get_ns();
	struct sync_entry *s;
	__u32 key = (__u32)pid_tgid & sync_slot_mask;
	struct sync_slot *slot = bpf_map_lookup_elem(&sync_slots, &key);
	if (slot && (slot->owner == pid_tgid || __sync_val_compare_and_swap(&slot->owner, 0, pid_tgid) == 0))
		s = &slot->e;
	else
		s = bpf_task_storage_get(&sync_entries, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!s) {
		count_drop();
		return 0;
	}
	s->time = time;
	s->handle = ARG1(r);
	s->other = ARG2(r);
	s->func = (__u8)bpf_get_attach_cookie(r);
	s->active = 1;
	return 0;
}

PROGRAMS("uprobe", uprobe_sync)

static __always_inline int uretprobe_sync_body(struct regs *r)
{
	__u64 now = bpf_ktime_get_ns();
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 pid_tgid = current_pid_tgid(task);
	__u32 key = (__u32)pid_tgid & sync_slot_mask;
	struct sync_slot *slot = bpf_map_lookup_elem(&sync_slots, &key);
	struct sync_entry *s;
	if (slot && slot->owner == pid_tgid)
		s = &slot->e;
	else {
		slot = 0;
		s = bpf_task_storage_get(&sync_entries, task, 0, 0);
	}
	if (!s || !s->active)
		return 0;
	s->active = 0;
	struct event *e = reserve(pid_tgid, current_cgroup(task), KIND_SYNC, s->func);
	if (e) {
		e->time = s->time;
		e->args[0] = s->handle;
		e->args[1] = s->other;
		e->args[2] = now - s->time;
		e->result = (__s32)RET(r);
	}
	// The slot is free once read: an exchange, not a plain store, so that
	// no weakly ordered CPU lets another thread's claim overtake the reads.
	if (slot)
		__sync_lock_test_and_set(&slot->owner, 0);
	ends_call(pid_tgid >> 32, now);
	if (e)
		submit(e, 0);
	return 0;
}

PROGRAMS("uretprobe", uretprobe_sync)

// GNU indirect functions: the symbol is a resolver that returns the
// implementation chosen for this CPU. A return probe on the resolver reports
// that address (cookie as for the function itself), and the tracer then
// probes the implementation.
static __always_inline int uretprobe_ifunc_body(struct regs *r)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct event *e = reserve(pid_tgid, bpf_get_current_cgroup_id(), KIND_IFUNC, bpf_get_attach_cookie(r));
	if (!e)
		return 0;
	e->time = bpf_ktime_get_ns();
	e->args[0] = RET(r);
	// Rare, and the tracer waits for it to attach: wake it now.
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

PROGRAMS("uretprobe", uretprobe_ifunc)

// An empty program: the baseline of the probe-cost benchmark (the cost of
// the trap alone at the same attach point).
static __always_inline int uprobe_noop_body(struct regs *r)
{
	return 0;
}

PROGRAMS("uprobe", uprobe_noop)

// Process exec and exit on raw tracepoints: they attach by name through
// BPF_RAW_TRACEPOINT_OPEN (kernel 4.17+), so they need neither tracefs nor
// debugfs mounted, and they skip the trace record a classic tracepoint
// builds before calling the program. Nothing is read from their arguments:
// the task is the current one in both.
SEC("raw_tracepoint/sched_process_exec")
int sched_exec(void *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u64 cgroup = bpf_get_current_cgroup_id();
	if (!traced(pid_tgid >> 32, cgroup))
		return 0;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct event *e = reserve(pid_tgid, cgroup, KIND_EXEC, 0);
	if (!e)
		return 0;
	e->time = bpf_ktime_get_ns();
	e->dims[0] = BPF_CORE_READ(task, real_parent, tgid);
	bpf_get_current_comm(&e->args, 16);
	submit(e, 0);
	return 0;
}

SEC("raw_tracepoint/sched_process_exit")
int sched_exit(void *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	// A thread that exits inside a synchronizer (a process killed while it
	// waits for the GPU) never returns from it: free its sync slot, so
	// that the thread id's next user finds it free.
	__u32 key = (__u32)pid_tgid & sync_slot_mask;
	struct sync_slot *slot = bpf_map_lookup_elem(&sync_slots, &key);
	if (slot && slot->owner == pid_tgid)
		__sync_val_compare_and_swap(&slot->owner, pid_tgid, 0);
	__u64 cgroup = bpf_get_current_cgroup_id();
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	// One event per process: when its last thread exits.
	if (BPF_CORE_READ(task, signal, live.counter) != 0)
		return 0;
	__u32 tgid = pid_tgid >> 32;
	// Its gate, its expediting and its armed gates go with it, traced or
	// not.
	bpf_map_delete_elem(&launch_gate, &tgid);
	bpf_map_delete_elem(&gate_stops, &tgid);
	if (expedite_listed) {
		bpf_map_delete_elem(&expedite, &tgid);
		bpf_map_delete_elem(&gate_armed, &tgid);
	}
	if (!traced(tgid, cgroup))
		return 0;
	// The process is gone: a later one that reuses its pid is not listed.
	bpf_map_delete_elem(&filter_tgids, &tgid);
	struct event *e = reserve(pid_tgid, cgroup, KIND_EXIT, 0);
	if (!e)
		return 0;
	e->time = bpf_ktime_get_ns();
	e->result = BPF_CORE_READ(task, exit_code);
	bpf_get_current_comm(&e->args, 16);
	submit(e, 0);
	return 0;
}
