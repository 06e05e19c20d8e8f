package caps

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// Feature is a facility of the running kernel that tracing or enforcing
// needs: a build option, a minimum version, a mounted filesystem or a
// resource limit.
type Feature int

// Kernel features Arbiter needs, in the order a failure is blamed on them:
// without the first nothing else works.
const (
	// FeatureBPF is the bpf() system call (CONFIG_BPF_SYSCALL).
	FeatureBPF Feature = iota + 1
	// FeatureBTF is the kernel's own type information, which the probes'
	// CO-RE field reads need (CONFIG_DEBUG_INFO_BTF, /sys/kernel/btf/vmlinux).
	FeatureBTF
	// FeatureRingBuf is the BPF ring buffer the probes report through (5.8).
	FeatureRingBuf
	// FeatureUprobes is attaching BPF programs to user-space functions
	// (CONFIG_UPROBE_EVENTS).
	FeatureUprobes
	// FeatureCookies is bpf_get_attach_cookie in uprobe programs, which tells
	// a probe which function it sits on (5.15).
	FeatureCookies
	// FeatureTracefs is a mounted tracefs, where tracepoints are looked up.
	FeatureTracefs
	// FeatureBPFFS is a mounted BPF filesystem, where maps and links are
	// pinned to outlive the process.
	FeatureBPFFS
	// FeatureMemlock is enough locked memory for BPF maps: kernels before
	// 5.11 charge them to RLIMIT_MEMLOCK.
	FeatureMemlock
)

// String names the feature as the error messages do.
func (f Feature) String() string {
	switch f {
	case FeatureBPF:
		return "the bpf() system call"
	case FeatureBTF:
		return "kernel BTF"
	case FeatureRingBuf:
		return "the BPF ring buffer"
	case FeatureUprobes:
		return "uprobes"
	case FeatureCookies:
		return "BPF cookies on uprobes"
	case FeatureTracefs:
		return "tracefs mounted"
	case FeatureBPFFS:
		return "the BPF filesystem mounted at /sys/fs/bpf"
	case FeatureMemlock:
		return "enough locked memory for BPF maps (RLIMIT_MEMLOCK)"
	}
	return "kernel feature " + strconv.Itoa(int(f))
}

// MinKernel is the first mainline kernel that has the feature, "" where no
// version brings it by itself (a build option, a mount, a limit).
func (f Feature) MinKernel() string {
	switch f {
	case FeatureBTF:
		return "5.4"
	case FeatureRingBuf:
		return "5.8"
	case FeatureCookies:
		return "5.15"
	}
	return ""
}

// Fix says how to get the feature.
func (f Feature) Fix() string {
	switch f {
	case FeatureBPF:
		return "boot a kernel built with CONFIG_BPF_SYSCALL=y (every major distribution's is); " +
			"in a container, use a seccomp profile that allows bpf() (or run it privileged)"
	case FeatureBTF:
		return "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y, which provides /sys/kernel/btf/vmlinux (Ubuntu 20.10+, Debian 11+, RHEL 8.2+ and Fedora kernels are)"
	case FeatureRingBuf, FeatureCookies:
		return "upgrade the kernel to 5.15 or later, the oldest Arbiter traces on"
	case FeatureUprobes:
		return "boot a kernel built with CONFIG_UPROBE_EVENTS=y (every major distribution's is)"
	case FeatureTracefs:
		return "mount it (mount -t tracefs nodev /sys/kernel/tracing); in a container, mount the host's /sys/kernel/tracing into it"
	case FeatureBPFFS:
		return "mount it (mount -t bpf bpf /sys/fs/bpf); in a container, mount the host's /sys/fs/bpf into it"
	case FeatureMemlock:
		return "raise the limit (ulimit -l unlimited, or LimitMEMLOCK=infinity in the systemd unit), " +
			"grant CAP_SYS_RESOURCE so arbiter raises it itself, or upgrade the kernel to 5.11 or later"
	}
	return "upgrade the kernel to 5.15 or later"
}

// FeatureError says that an operation failed because the kernel lacks a
// feature, which one, from which kernel version it exists and how to get it.
// Like MissingError it makes the command exit with status 77.
type FeatureError struct {
	// What needs the feature, e.g. "tracing CUDA calls".
	What string
	// Feature is what is missing.
	Feature Feature
	// Err is the failure that revealed it, nil when a probe found it before
	// anything failed.
	Err error
}

// Error names the feature, its minimum kernel and the fix, then the cause.
func (e *FeatureError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s needs %s", e.What, e.Feature)
	if v := e.Feature.MinKernel(); v != "" {
		fmt.Fprintf(&b, " (kernel %s or later)", v)
	}
	fmt.Fprintf(&b, ", which this system lacks: %s", e.Feature.Fix())
	if e.Err != nil {
		fmt.Fprintf(&b, " (%v)", e.Err)
	}
	return b.String()
}

// Unwrap returns the failure that revealed the missing feature.
func (e *FeatureError) Unwrap() error { return e.Err }

// ExitCode makes a missing kernel feature exit with status 77, as a missing
// privilege does: the environment, not the request, is at fault.
func (e *FeatureError) ExitCode() int { return 77 }

// Diagnose explains err, the failure of loading or attaching BPF programs
// for what, when a missing kernel feature caused it: it returns a
// *FeatureError wrapping err, else err unchanged. A memlock or tracefs
// failure is recognised by its message; otherwise each of needs is probed
// in turn and the first one missing is blamed, so that nothing is blamed
// that the kernel has. probe checks one feature, nil meaning ProbeFeature.
func Diagnose(what string, err error, probe func(Feature) error, needs ...Feature) error {
	if err == nil {
		return nil
	}
	var fe *FeatureError
	var me *MissingError
	if errors.As(err, &fe) || errors.As(err, &me) {
		return err
	}
	msg := err.Error()
	switch {
	case errors.Is(err, unix.EPERM) && strings.Contains(msg, "MEMLOCK"):
		return &FeatureError{What: what, Feature: FeatureMemlock, Err: err}
	case strings.Contains(msg, "neither debugfs nor tracefs are mounted"):
		return &FeatureError{What: what, Feature: FeatureTracefs, Err: err}
	}
	if probe == nil {
		probe = ProbeFeature
	}
	for _, f := range needs {
		if perr := probe(f); errors.Is(perr, ebpf.ErrNotSupported) {
			return &FeatureError{What: what, Feature: f, Err: err}
		}
	}
	return err
}

// ProbeFeature checks the running kernel for f. It returns nil when f is
// present, an error for which errors.Is(err, ebpf.ErrNotSupported) holds
// when it is missing, and any other error when the probe itself failed.
// The BPF probes need CAP_BPF (or root) to be conclusive.
func ProbeFeature(f Feature) error {
	switch f {
	case FeatureBPF:
		// A command of 0 with no attribute: EINVAL or EFAULT when bpf()
		// exists, ENOSYS when the kernel was built without it.
		_, _, errno := unix.Syscall(unix.SYS_BPF, 0, 0, 0)
		if errno == unix.ENOSYS {
			return fmt.Errorf("bpf(): %w: %w", errno, ebpf.ErrNotSupported)
		}
		return nil
	case FeatureBTF:
		if _, err := os.Stat("/sys/kernel/btf/vmlinux"); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %w", err, ebpf.ErrNotSupported)
		} else if err != nil {
			return err
		}
		return nil
	case FeatureRingBuf:
		return features.HaveMapType(ebpf.RingBuf)
	case FeatureUprobes:
		return probeUprobes()
	case FeatureCookies:
		return features.HaveProgramHelper(ebpf.Kprobe, asm.FnGetAttachCookie)
	case FeatureTracefs:
		for _, p := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
			if isFS(p, unix.TRACEFS_MAGIC) || isFS(p, unix.DEBUGFS_MAGIC) {
				return nil
			}
		}
		return fmt.Errorf("no tracefs at /sys/kernel/tracing or /sys/kernel/debug/tracing: %w", ebpf.ErrNotSupported)
	case FeatureBPFFS:
		return probeBPFFS("/sys/fs/bpf")
	case FeatureMemlock:
		return probeMemlock()
	}
	return fmt.Errorf("probe %v: unknown feature", f)
}

// CheckBPFFS returns a *FeatureError when dir, where what pins its maps, is
// not on a BPF filesystem, nil when it is.
func CheckBPFFS(what, dir string) error {
	if err := probeBPFFS(dir); err != nil {
		return &FeatureError{What: what, Feature: FeatureBPFFS, Err: err}
	}
	return nil
}

// probeUprobes looks for the uprobe PMU (4.17+) or, on older kernels, the
// tracefs file uprobes are created through; either exists only with
// CONFIG_UPROBE_EVENTS.
func probeUprobes() error {
	for _, p := range []string{
		"/sys/bus/event_source/devices/uprobe/type",
		"/sys/kernel/tracing/uprobe_events",
		"/sys/kernel/debug/tracing/uprobe_events",
	} {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
	}
	return fmt.Errorf("no uprobe PMU in /sys/bus/event_source/devices and no uprobe_events in tracefs: %w", ebpf.ErrNotSupported)
}

// probeBPFFS reports whether dir is on a BPF filesystem.
func probeBPFFS(dir string) error {
	if isFS(dir, unix.BPF_FS_MAGIC) {
		return nil
	}
	return fmt.Errorf("%s is not a BPF filesystem: %w", dir, ebpf.ErrNotSupported)
}

func isFS(path string, magic int64) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && int64(st.Type) == magic
}

// probeMemlock reports a memlock limit too low for BPF maps: only kernels
// before 5.11 charge maps to it, and an unlimited one always suffices.
func probeMemlock() error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		return fmt.Errorf("read RLIMIT_MEMLOCK: %w", err)
	}
	if lim.Cur == unix.RLIM_INFINITY {
		return nil
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return fmt.Errorf("uname: %w", err)
	}
	if kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 5, 11) {
		return nil
	}
	return fmt.Errorf("RLIMIT_MEMLOCK is %d bytes on a kernel that charges BPF maps to it: %w", lim.Cur, ebpf.ErrNotSupported)
}

// kernelAtLeast reports whether a release string such as "5.15.0-91-generic"
// is major.minor or later; an unparsable one counts as recent.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return true
	}
	maj, err1 := strconv.Atoi(parts[0])
	digits := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if digits >= 0 {
		parts[1] = parts[1][:digits]
	}
	min, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return true
	}
	return maj > major || maj == major && min >= minor
}
