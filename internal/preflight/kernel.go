package preflight

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/nvrm"
)

// minKernel is the oldest kernel Arbiter traces on: BPF cookies on uprobes
// arrived in 5.15.
var minKernel = [2]int{5, 15}

// Kernel settings the checks show.
const (
	unprivBPFPath = "/proc/sys/kernel/unprivileged_bpf_disabled"
	paranoidPath  = "/proc/sys/kernel/perf_event_paranoid"
	btfPath       = "/sys/kernel/btf/vmlinux"
)

// checkKernel checks the running kernel's version.
func checkKernel(*env) result {
	rel := kernelRelease()
	maj, min, ok := parseRelease(rel)
	switch {
	case !ok:
		return result{Warn, fmt.Sprintf("%s: cannot tell the version from the release string; Arbiter needs %d.%d or later", rel, minKernel[0], minKernel[1]),
			"check `uname -r` by hand: the kernel must be 5.15 or later"}
	case maj < minKernel[0] || maj == minKernel[0] && min < minKernel[1]:
		return result{Fail, fmt.Sprintf("%s: older than %d.%d, the oldest Arbiter traces on (BPF cookies on uprobes)", rel, minKernel[0], minKernel[1]),
			caps.FeatureCookies.Fix()}
	}
	return result{OK, fmt.Sprintf("%s (%d.%d or later needed)", rel, minKernel[0], minKernel[1]), ""}
}

// checkBTF checks for the kernel's type information, which the probes'
// CO-RE field reads need.
func checkBTF(*env) result {
	st, err := os.Stat(btfPath)
	if err != nil {
		return result{Fail, fmt.Sprintf("%s: %v", btfPath, err), caps.FeatureBTF.Fix()}
	}
	return result{OK, fmt.Sprintf("%s present (%.1f MiB)", btfPath, float64(st.Size())/(1<<20)), ""}
}

// checkMemlock checks that RLIMIT_MEMLOCK does not stop BPF maps, then
// raises it as arbiter does before it loads anything.
func checkMemlock(e *env) result {
	defer func() { _ = rlimit.RemoveMemlock() }()
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		return result{Fail, fmt.Sprintf("read RLIMIT_MEMLOCK: %v", err), "run arbiter where getrlimit(2) is allowed"}
	}
	limit := "unlimited"
	if lim.Cur != unix.RLIM_INFINITY {
		limit = fmt.Sprintf("%d KiB", lim.Cur>>10)
	}
	err := caps.ProbeFeature(caps.FeatureMemlock)
	switch {
	case err == nil && lim.Cur == unix.RLIM_INFINITY:
		return result{OK, "RLIMIT_MEMLOCK unlimited", ""}
	case err == nil:
		return result{OK, "RLIMIT_MEMLOCK " + limit + "; this kernel (5.11+) charges BPF maps to the memory cgroup instead", ""}
	case !errors.Is(err, ebpf.ErrNotSupported):
		return result{Warn, err.Error(), "check `ulimit -l`: kernels before 5.11 need it unlimited for BPF maps"}
	case e.have.Has(capSysResource):
		return result{OK, "RLIMIT_MEMLOCK " + limit + " on a kernel before 5.11, which charges BPF maps to it; arbiter raises it (CAP_SYS_RESOURCE held)", ""}
	}
	return result{Fail, "RLIMIT_MEMLOCK " + limit + " on a kernel before 5.11, which charges BPF maps to it, and CAP_SYS_RESOURCE to raise it is not held",
		caps.FeatureMemlock.Fix()}
}

// checkBPFPermission checks that this process may load tracing programs:
// CAP_BPF (or CAP_SYS_ADMIN), and that the kernel then really loads one
// (a seccomp profile or a security module may still refuse bpf()).
func checkBPFPermission(e *env) result {
	if r, bad := e.capsProblem(); bad {
		return r
	}
	unpriv := "kernel.unprivileged_bpf_disabled=" + readSetting(unprivBPFPath)
	if !e.holds(caps.BPF) {
		return result{Fail, "CAP_BPF (or CAP_SYS_ADMIN) is not held, and tracing programs need it whatever " + unpriv + " says",
			e.grantFix(caps.BPF)}
	}
	prog, err := loadProgram(ebpf.Kprobe)
	if err != nil {
		err = caps.Diagnose("loading a tracing program", err, nil, caps.FeatureBPF)
		return result{Fail, heldDetail(e.have, caps.BPF) + ", but " + err.Error(),
			"allow the bpf() system call: in a container, a seccomp profile that allows it (or privileged); on the host, check the security modules (lockdown, SELinux) in dmesg"}
	}
	prog.Close()
	return result{OK, heldDetail(e.have, caps.BPF) + "; a tracing program loads; " + unpriv, ""}
}

// checkPerfPermission checks for CAP_PERFMON (or CAP_SYS_ADMIN), which
// attaching uprobes and tracepoints through perf events needs whatever
// perf_event_paranoid says.
func checkPerfPermission(e *env) result {
	if r, bad := e.capsProblem(); bad {
		return r
	}
	paranoid := "kernel.perf_event_paranoid=" + readSetting(paranoidPath)
	if !e.holds(caps.Perfmon) {
		return result{Fail, "CAP_PERFMON (or CAP_SYS_ADMIN) is not held; attaching uprobes needs it whatever " + paranoid + " says",
			e.grantFix(caps.Perfmon)}
	}
	return result{OK, heldDetail(e.have, caps.Perfmon) + "; " + paranoid, ""}
}

// checkRingBuffer checks for the BPF ring buffer the probes report
// through (5.8).
func checkRingBuffer(e *env) result {
	return featureResult(e, caps.FeatureRingBuf, features.HaveMapType(ebpf.RingBuf), "BPF ring buffer maps are supported")
}

// checkCookies checks for bpf_get_attach_cookie in uprobe programs (5.15),
// which tells a probe which function it sits on.
func checkCookies(e *env) result {
	return featureResult(e, caps.FeatureCookies, features.HaveProgramHelper(ebpf.Kprobe, asm.FnGetAttachCookie), "bpf_get_attach_cookie is available to uprobe programs")
}

// checkSendSignal checks for bpf_send_signal (5.3), with which the launch
// gate's probe stops the process that hits it.
func checkSendSignal(e *env) result {
	if !e.holds(caps.BPF) {
		return notTested()
	}
	err := features.HaveProgramHelper(ebpf.Kprobe, asm.FnSendSignal)
	switch {
	case err == nil:
		return result{OK, "bpf_send_signal is available to uprobe programs", ""}
	case errors.Is(err, ebpf.ErrNotSupported):
		return result{Fail, "the kernel lacks bpf_send_signal (5.3 or later)", caps.FeatureCookies.Fix()}
	}
	return result{Warn, "probe bpf_send_signal: " + err.Error(), "run doctor as root to find out"}
}

// featureResult turns a cilium/ebpf feature probe into a result: the probe
// is conclusive only with CAP_BPF.
func featureResult(e *env, f caps.Feature, err error, ok string) result {
	if !e.holds(caps.BPF) {
		return notTested()
	}
	switch {
	case err == nil:
		return result{OK, ok, ""}
	case errors.Is(err, ebpf.ErrNotSupported):
		return result{Fail, fmt.Sprintf("the kernel lacks %s (%s or later): %v", f, f.MinKernel(), err), f.Fix()}
	}
	return result{Warn, fmt.Sprintf("probe %s: %v", f, err), "run doctor as root to find out"}
}

// notTested is the result of a kernel feature that only a privileged
// process can test.
func notTested() result {
	return result{Warn, "not tested: testing it loads a BPF program, which needs CAP_BPF (see bpf-permission)",
		"run doctor with the privileges arbiter will run with (as root, or with its capabilities)"}
}

// checkUprobes checks for the uprobe PMU, through which uprobes attach
// without tracefs, then attaches a uprobe to this program's entry point,
// in this process only, and detaches it.
func checkUprobes(e *env) result {
	if err := caps.ProbeFeature(caps.FeatureUprobes); err != nil {
		return result{Fail, err.Error(), caps.FeatureUprobes.Fix()}
	}
	pmu := "uprobe PMU at /sys/bus/event_source/devices/uprobe"
	if _, err := os.Stat("/sys/bus/event_source/devices/uprobe/type"); err != nil {
		pmu = "no uprobe PMU, only tracefs's uprobe_events (kernel before 4.17)"
	}
	if !e.holds(caps.BPF) || !e.holds(caps.Perfmon) {
		return result{Warn, pmu + "; attaching one not tested: it needs CAP_BPF and CAP_PERFMON (see bpf-permission, perf-permission)",
			"run doctor with the privileges arbiter will run with (as root, or with its capabilities)"}
	}
	if err := attachOwnUprobe(); err != nil {
		return result{Fail, pmu + ", but attaching a uprobe failed: " + err.Error(),
			"allow perf_event_open in the container's seccomp profile (or run it privileged); on the host, check kernel.perf_event_paranoid and the security modules"}
	}
	multi := "uprobe_multi links (6.6+) supported"
	if err := features.HaveBPFLinkUprobeMulti(); err != nil {
		multi = "no uprobe_multi links: one perf event per probe site"
	}
	return result{OK, pmu + "; a uprobe attached and detached; " + multi, ""}
}

// attachOwnUprobe attaches a uprobe at this executable's entry point,
// which runs once at start and so is never hit, filtered to this process,
// and detaches it.
func attachOwnUprobe() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	off, err := entryOffset(self)
	if err != nil {
		return err
	}
	prog, err := loadProgram(ebpf.Kprobe)
	if err != nil {
		return err
	}
	defer prog.Close()
	ex, err := link.OpenExecutable(self)
	if err != nil {
		return err
	}
	l, err := ex.Uprobe("", prog, &link.UprobeOptions{Address: off, PID: os.Getpid()})
	if err != nil {
		return err
	}
	return l.Close()
}

// entryOffset returns the file offset of an executable's entry point.
func entryOffset(path string) (uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && p.Vaddr <= f.Entry && f.Entry < p.Vaddr+p.Filesz {
			return f.Entry - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("%s: entry point %#x in no executable segment", path, f.Entry)
}

// checkRawTracepoints attaches a program to the raw tracepoints the
// tracers follow processes with, and detaches it.
func checkRawTracepoints(e *env) result {
	if !e.holds(caps.BPF) {
		return notTested()
	}
	prog, err := loadProgram(ebpf.RawTracepoint)
	if err != nil {
		return result{Fail, "load a raw tracepoint program: " + err.Error(), "upgrade the kernel to 5.15 or later"}
	}
	defer prog.Close()
	names := []string{"sched_process_exec", "sched_process_exit"}
	for _, name := range names {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: name, Program: prog})
		if err != nil {
			return result{Fail, fmt.Sprintf("attach to the raw tracepoint %s: %v", name, err), "upgrade the kernel to 5.15 or later"}
		}
		l.Close()
	}
	return result{OK, strings.Join(names, " and ") + " attached and detached", ""}
}

// checkIoctlTracer attaches the RM ioctl tracer the way channel control
// does, says which path it took and whether tracefs is mounted, and
// closes it.
func checkIoctlTracer(e *env) result {
	mounted := caps.ProbeFeature(caps.FeatureTracefs) == nil
	tracefs := "tracefs not mounted (not needed)"
	if mounted {
		tracefs = "tracefs mounted"
	}
	if !e.holds(caps.BPF) || !e.holds(caps.Perfmon) {
		return result{Warn, tracefs + "; the attach path is not tested: it needs CAP_BPF and CAP_PERFMON (see bpf-permission, perf-permission)",
			"run doctor with the privileges arbiter will run with (as root, or with its capabilities)"}
	}
	t, err := nvrm.NewTracer(nil)
	if err != nil {
		err = caps.Diagnose("tracing RM calls", err, nil, caps.FeatureBPF, caps.FeatureBTF, caps.FeatureRingBuf)
		return result{Fail, tracefs + "; " + err.Error(),
			"the kernel refused every attach path (fentry, the syscall tracepoints, the raw sys_enter/sys_exit tracepoints): run doctor as root, and see the error of each"}
	}
	path := t.AttachPath()
	if err := t.Close(); err != nil {
		return result{Warn, fmt.Sprintf("attached through %s, but closing failed: %v", path, err), "report it: the tracer's links may be left attached until arbiter exits"}
	}
	detail := fmt.Sprintf("%s; the tracer attaches through %s (%s)", tracefs, path.String(), string(path))
	if path == nvrm.AttachSyscallTracepoint && !mounted {
		detail += ", their ids read from tracefs mounted in a private mount namespace"
	}
	if path == nvrm.AttachRawSyscall {
		return result{Warn, detail + ": every system call of every process runs its program",
			"grant CAP_SYS_ADMIN, with which the tracer mounts tracefs in a private mount namespace and uses the cheaper syscall tracepoints, or mount tracefs on the host (mount -t tracefs nodev /sys/kernel/tracing)"}
	}
	return result{OK, detail, ""}
}

// checkBPFFS checks for the BPF filesystem at /sys/fs/bpf, where the
// daemon pins the state that lets its next start undo a suspension or a
// gate it left behind.
func checkBPFFS(e *env) result {
	const dir = "/sys/fs/bpf"
	if caps.ProbeFeature(caps.FeatureBPFFS) == nil {
		return result{OK, dir + " is a BPF filesystem", ""}
	}
	if e.holds(caps.SysAdmin) {
		return result{OK, dir + " is not a BPF filesystem; arbiter mounts one there (CAP_SYS_ADMIN held)", ""}
	}
	return result{Warn, dir + " is not a BPF filesystem and CAP_SYS_ADMIN to mount one is not held: state that outlives the daemon falls back to its state file",
		caps.FeatureBPFFS.Fix()}
}

// loadProgram loads the smallest program of type t: return 0.
func loadProgram(t ebpf.ProgramType) (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         t,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
}

// kernelRelease returns uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// parseRelease reads major and minor from a release such as
// "5.15.0-91-generic".
func parseRelease(rel string) (int, int, bool) {
	parts := strings.SplitN(rel, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	if i := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		parts[1] = parts[1][:i]
	}
	maj, err1 := strconv.Atoi(parts[0])
	min, err2 := strconv.Atoi(parts[1])
	return maj, min, err1 == nil && err2 == nil
}

// readSetting returns a /proc/sys value, or "unknown".
func readSetting(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
