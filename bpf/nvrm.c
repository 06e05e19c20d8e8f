//go:build ignore

// NVIDIA Resource Manager handle discovery: every RM allocation, free and
// channel-group control a process issues on the driver's control device
// (/dev/nvidiactl, char 195:255) is recorded when the ioctl returns, once the
// driver has written its results. Process exits of traced processes are
// reported too, so the registry can forget them.
//
// Where the programs attach, in the order the loader tries them:
//  1. fentry/fexit on the ioctl system call itself (__x64_sys_ioctl,
//     __arm64_sys_ioctl; BPF trampolines, x86-64 5.5+, arm64 6.0+): only
//     ioctl(2) runs a program, and no other system call pays anything.
//  2. the syscalls/sys_enter_ioctl and sys_exit_ioctl tracepoints: every
//     system call takes the kernel's slower traced path while they are
//     attached (~70 ns more per call on a paravirtualized guest), but only
//     ioctl runs a program. Their ids come from tracefs; where it is not
//     mounted, the loader mounts it in a private mount namespace of its own
//     (CAP_SYS_ADMIN), so the host's mounts are never changed.
//  3. the raw sys_enter/sys_exit tracepoints (4.17+): every system call of
//     every process runs the program, which returns at once unless it is an
//     ioctl (~140 ns more per unrelated call on the same guest). The last
//     resort: no trampolines, no tracefs and no CAP_SYS_ADMIN.
// None needs tracefs or debugfs mounted on the host, and none needs kprobes
// (not available on every kernel: lockdown, distribution configs).
//
// The filters come first and are cheap: the ioctl type byte 'F', the RM
// escape number, then the device number of the descriptor's file, read
// from the task's file table with CO-RE reads. Checking the device here
// (rather than recording every 'F' ioctl and filtering in Go through
// /proc/PID/fd) keeps other drivers that share the 'F' magic out of the ring
// buffer, and is exact: the check runs in the calling task at the moment of
// the call, so a descriptor closed and reused before Go could look at it
// cannot fool it.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

// "Dual BSD/GPL": bpf_probe_read_user/_kernel and bpf_get_current_task are
// GPL-only helpers.
char __license[] SEC("license") = "Dual BSD/GPL";

// Kernel structures, only the members read here. preserve_access_index makes
// every access a CO-RE relocation resolved against the running kernel's BTF,
// so no vmlinux.h is needed and member offsets may differ between kernels.
struct inode {
	__u32 i_rdev;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct task_struct {
	struct files_struct *files;
} __attribute__((preserve_access_index));

// The registers a system call was entered with, and the system call number
// of ioctl(2), per target architecture. The argument registers are the
// user-visible pt_regs layout (stable ABI); the syscall number at sys_exit
// is read with CO-RE.
#if defined(__TARGET_ARCH_x86)
struct pt_regs {
	long orig_ax;
	unsigned long di;
	unsigned long si;
	unsigned long dx;
} __attribute__((preserve_access_index));
#define SYSCALL_ARG1(r) BPF_CORE_READ(r, di)
#define SYSCALL_ARG2(r) BPF_CORE_READ(r, si)
#define SYSCALL_ARG3(r) BPF_CORE_READ(r, dx)
#define SYSCALL_NR(r) BPF_CORE_READ(r, orig_ax)
#define NR_IOCTL 16
#define SYS_IOCTL "__x64_sys_ioctl"
#elif defined(__TARGET_ARCH_arm64)
struct pt_regs {
	__u64 regs[31];
	int syscallno;
} __attribute__((preserve_access_index));
#define SYSCALL_ARG1(r) BPF_CORE_READ(r, regs[0])
#define SYSCALL_ARG2(r) BPF_CORE_READ(r, regs[1])
#define SYSCALL_ARG3(r) BPF_CORE_READ(r, regs[2])
#define SYSCALL_NR(r) BPF_CORE_READ(r, syscallno)
#define NR_IOCTL 29
#define SYS_IOCTL "__arm64_sys_ioctl"
#else
#error "unsupported target architecture: build with bpf2go -target amd64,arm64"
#endif

// Record kinds (nvrm_record.kind).
#define REC_ALLOC 1
#define REC_FREE 2
#define REC_CONTROL 3
#define REC_EXIT 4

// RM escapes (ioctl numbers' low byte) and the transfer indirection.
#define NV_IOCTL_MAGIC 0x46
#define ESC_RM_FREE 0x29
#define ESC_RM_CONTROL 0x2A
#define ESC_RM_ALLOC 0x2B
#define ESC_XFER 211

// Bytes of a parameter block copied into a record: NVOS64, the largest.
#define BLOCK_MAX 48
// Bytes of the allocation or control parameters copied into a record.
#define PARAMS_MAX 16

// Drop counters (index into the drops map).
#define DROP_RINGBUF 0 // ring buffer full
#define DROP_READ 1    // user memory unreadable at sys_exit
#define DROP_INFLIGHT 2 // inflight map full
#define DROP_COUNT 3

// nvrm_record is one traced RM call, written at sys_exit. block is the
// parameter struct (NVOS00/21/54/64) as the driver left it; params the first
// bytes of the allocation's or control's own parameters where the call has
// some that matter. Decoding is left to Go, where it is testable.
struct nvrm_record {
	__u64 time_ns;
	__u64 cgroup;
	__u32 pid;
	__u32 tid;
	__s32 fd;
	__s32 ret;
	__u8 kind;
	__u8 xfer;
	__u8 pad[2];
	__u32 esc;
	__u32 size;
	__u32 params_len;
	__u8 block[BLOCK_MAX];
	__u8 params[PARAMS_MAX];
};

// Referenced so that bpf2go's -type finds the struct in BTF.
const struct nvrm_record *unused_nvrm_record __attribute__((unused));

// What sys_enter saw, for sys_exit.
struct inflight {
	__u64 time_ns;
	__u64 ptr;
	__s32 fd;
	__u32 esc;
	__u32 size;
	__u8 xfer;
};

// Configuration, set from Go through spec.Variables before loading.
// ctl_rdev is the kernel-encoded device number (major<<20 | minor) of the
// control device; a test points it at a stand-in. accept_ret lets a test's
// stand-in file, on which the ioctl itself fails, be traced: a return value
// of 0 or accept_ret counts as RM having run.
volatile const __u32 ctl_rdev = (195 << 20) | 255;
volatile const __s32 accept_ret = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nvrm_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32); // tid
	__type(value, struct inflight);
} nvrm_inflight SEC(".maps");

// Processes that issued a recorded RM call; their exit is reported.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); // tgid
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nvrm_seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DROP_COUNT);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} nvrm_drops SEC(".maps");

static __always_inline void count_drop(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&nvrm_drops, &idx);
	if (v)
		*v += 1;
}

// fd_rdev returns the device number of the current task's descriptor fd, or
// 0 when it has none (not open, not a device).
static __always_inline __u32 fd_rdev(__u32 fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt)
		return 0;
	if (fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = 0;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return 0;
	return BPF_CORE_READ(f, f_inode, i_rdev);
}

// ioctl_enter runs at the entry of every ioctl(2): the filters come first
// and are cheap (the type byte 'F', the RM escape, then the device of the
// descriptor), and a call that passes them is kept for ioctl_exit.
static __always_inline void ioctl_enter(__u64 fd, __u64 cmd64, __u64 arg)
{
	__u32 cmd = (__u32)cmd64;
	if (((cmd >> 8) & 0xff) != NV_IOCTL_MAGIC)
		return;
	struct inflight in = {};
	in.esc = cmd & 0xff;
	in.size = (cmd >> 16) & 0x3fff;
	in.ptr = arg;
	if (in.esc == ESC_XFER) {
		// nv_ioctl_xfer_t {u32 cmd, u32 size, u64 ptr}: the real escape
		// and its parameters are one indirection away.
		struct {
			__u32 cmd;
			__u32 size;
			__u64 ptr;
		} x;
		if (in.size != sizeof(x) || bpf_probe_read_user(&x, sizeof(x), (void *)arg))
			return;
		in.esc = x.cmd;
		in.size = x.size;
		in.ptr = x.ptr;
		in.xfer = 1;
	}
	if (in.esc != ESC_RM_ALLOC && in.esc != ESC_RM_FREE && in.esc != ESC_RM_CONTROL)
		return;
	if (fd_rdev((__u32)fd) != ctl_rdev)
		return;
	in.fd = (__s32)fd;
	in.time_ns = bpf_ktime_get_ns();
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	if (bpf_map_update_elem(&nvrm_inflight, &tid, &in, BPF_ANY))
		count_drop(DROP_INFLIGHT);
}

// Channel-group controls recorded, with the bytes of their parameters read.
static __always_inline __u32 control_params_len(__u32 cmd)
{
	switch (cmd) {
	case 0xA06C0101: // GPFIFO_SCHEDULE: bEnable is the first byte
		return 1;
	case 0xA06C0103: // SET_TIMESLICE: u64 µs
		return 8;
	case 0xA06C0105: // PREEMPT: bWait, bManualTimeout, timeoutUs
		return 8;
	case 0xA06C0107: // SET_INTERLEAVE_LEVEL: u32
		return 4;
	}
	return 0xffffffff;
}

// Allocation parameters read per class: a device's deviceId, a
// subdevice's subDeviceId, a channel group's engineType (offset 12).
static __always_inline __u32 alloc_params_len(__u32 class)
{
	switch (class) {
	case 0x80:
	case 0x2080:
		return 4;
	case 0xA06C:
		return 16;
	}
	return 0;
}

// ioctl_exit runs when an ioctl(2) returns: for a call ioctl_enter kept, the
// driver has written its results into the parameter block by now.
static __always_inline void ioctl_exit(__s64 ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct inflight *in = bpf_map_lookup_elem(&nvrm_inflight, &tid);
	if (!in)
		return;
	struct inflight f = *in;
	bpf_map_delete_elem(&nvrm_inflight, &tid);
	if (ret != 0 && ret != accept_ret)
		return;

	struct nvrm_record *r = bpf_ringbuf_reserve(&nvrm_events, sizeof(*r), 0);
	if (!r) {
		count_drop(DROP_RINGBUF);
		return;
	}
	__builtin_memset(r, 0, sizeof(*r));
	r->time_ns = f.time_ns;
	r->cgroup = bpf_get_current_cgroup_id();
	r->pid = id >> 32;
	r->tid = tid;
	r->fd = f.fd;
	r->ret = (__s32)ret;
	r->xfer = f.xfer;
	r->esc = f.esc;
	r->size = f.size;

	__u32 status_off, cmd_or_class = 0;
	long err;
	switch (f.size) {
	case 16: // NVOS00
		err = bpf_probe_read_user(r->block, 16, (void *)f.ptr);
		status_off = 12;
		break;
	case 32: // NVOS21, NVOS54
		err = bpf_probe_read_user(r->block, 32, (void *)f.ptr);
		status_off = 28;
		break;
	case 48: // NVOS64
		err = bpf_probe_read_user(r->block, 48, (void *)f.ptr);
		status_off = 40;
		break;
	default:
		goto discard;
	}
	if (err) {
		count_drop(DROP_READ);
		goto discard;
	}
	// Only calls RM carried out: its status is the struct's, not the
	// ioctl's.
	if (*(__u32 *)&r->block[status_off & 63])
		goto discard;

	__u32 want = 0;
	switch (f.esc) {
	case ESC_RM_ALLOC:
		if (f.size == 16)
			goto discard;
		r->kind = REC_ALLOC;
		cmd_or_class = *(__u32 *)&r->block[12];
		want = alloc_params_len(cmd_or_class);
		break;
	case ESC_RM_FREE:
		if (f.size != 16)
			goto discard;
		r->kind = REC_FREE;
		break;
	case ESC_RM_CONTROL:
		if (f.size != 32)
			goto discard;
		r->kind = REC_CONTROL;
		cmd_or_class = *(__u32 *)&r->block[8];
		want = control_params_len(cmd_or_class);
		if (want == 0xffffffff)
			goto discard;
		break;
	default:
		goto discard;
	}
	if (want) {
		__u64 p = *(__u64 *)&r->block[16]; // pAllocParms, params
		if (p) {
			if (want == 16)
				err = bpf_probe_read_user(r->params, 16, (void *)p);
			else if (want == 8)
				err = bpf_probe_read_user(r->params, 8, (void *)p);
			else if (want == 4)
				err = bpf_probe_read_user(r->params, 4, (void *)p);
			else
				err = bpf_probe_read_user(r->params, 1, (void *)p);
			if (err)
				count_drop(DROP_READ);
			else
				r->params_len = want;
		}
	}
	__u8 one = 1;
	__u32 tgid = id >> 32;
	bpf_map_update_elem(&nvrm_seen, &tgid, &one, BPF_ANY);
	bpf_ringbuf_submit(r, 0);
	return;

discard:
	bpf_ringbuf_discard(r, 0);
}

// Attach path 1: fentry/fexit on the ioctl system call. Its one argument
// is the pt_regs the call was entered with; fexit also sees the return
// value.
SEC("fentry/" SYS_IOCTL)
int nvrm_enter(__u64 *ctx)
{
	struct pt_regs *regs = (struct pt_regs *)ctx[0];
	ioctl_enter(SYSCALL_ARG1(regs), SYSCALL_ARG2(regs), SYSCALL_ARG3(regs));
	return 0;
}

SEC("fexit/" SYS_IOCTL)
int nvrm_exit(__u64 *ctx)
{
	ioctl_exit((__s64)ctx[1]);
	return 0;
}

// Attach path 2: the system call tracepoints of ioctl alone, with the field
// layout of their format files (events/syscalls/sys_*_ioctl/format).
struct enter_ctx {
	__u64 common;
	__s32 nr;
	__u32 pad;
	__u64 fd;
	__u64 cmd;
	__u64 arg;
};

struct exit_ctx {
	__u64 common;
	__s32 nr;
	__u32 pad;
	__s64 ret;
};

SEC("tracepoint/syscalls/sys_enter_ioctl")
int nvrm_tp_enter(struct enter_ctx *ctx)
{
	ioctl_enter(ctx->fd, ctx->cmd, ctx->arg);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_ioctl")
int nvrm_tp_exit(struct exit_ctx *ctx)
{
	ioctl_exit(ctx->ret);
	return 0;
}

// Attach path 3: the raw system call tracepoints, for every system call;
// sys_enter(regs, id), sys_exit(regs, ret).
SEC("raw_tracepoint/sys_enter")
int nvrm_sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	if (ctx->args[1] != NR_IOCTL)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	ioctl_enter(SYSCALL_ARG1(regs), SYSCALL_ARG2(regs), SYSCALL_ARG3(regs));
	return 0;
}

SEC("raw_tracepoint/sys_exit")
int nvrm_sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	if (SYSCALL_NR(regs) != NR_IOCTL)
		return 0;
	ioctl_exit((__s64)ctx->args[1]);
	return 0;
}

// A traced process's exit: the registry forgets its handles (RM frees a
// file's clients when its last reference closes, which exit does).
SEC("raw_tracepoint/sched_process_exit")
int nvrm_proc_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if ((__u32)id != tgid)
		return 0;
	if (!bpf_map_lookup_elem(&nvrm_seen, &tgid))
		return 0;
	bpf_map_delete_elem(&nvrm_seen, &tgid);
	struct nvrm_record *r = bpf_ringbuf_reserve(&nvrm_events, sizeof(*r), 0);
	if (!r) {
		count_drop(DROP_RINGBUF);
		return 0;
	}
	__builtin_memset(r, 0, sizeof(*r));
	r->time_ns = bpf_ktime_get_ns();
	r->cgroup = bpf_get_current_cgroup_id();
	r->pid = tgid;
	r->tid = tgid;
	r->fd = -1;
	r->kind = REC_EXIT;
	bpf_ringbuf_submit(r, 0);
	return 0;
}
