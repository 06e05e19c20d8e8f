package nvrm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/bpf"
	"github.com/gpu-arbiter/arbiter/trace"
)

// ErrClosed is returned by Read once the Tracer is closed.
var ErrClosed = fmt.Errorf("nvrm tracer: %w", trace.ErrClosed)

// DefaultPinPath is where a daemon pins the tracer's ring buffer, maps and
// links so that they outlive it (bpffs must be mounted at /sys/fs/bpf).
const DefaultPinPath = "/sys/fs/bpf/arbiter/nvrm"

// Tracer records RM allocations, frees and channel-group controls issued
// on the driver's control device, with eBPF programs on the ioctl system
// call (kernel 5.8+ for the ring buffer, CAP_BPF and CAP_PERFMON or root).
// Nothing needs tracefs or debugfs mounted: see AttachPath. One Tracer
// reads one ring buffer; Read is not safe for concurrent use, Close may be
// called from any goroutine and unblocks Read.
type Tracer struct {
	maps  bpf.NvrmMaps
	progs *ebpf.Collection
	path  AttachPath
	links map[string]link.Link
	rd    *ringbuf.Reader
	rec   ringbuf.Record
	opts  TracerOptions
	// Decoded counts records read, BadRecords those that failed to decode.
	decoded, bad uint64
}

// AttachPath is how the tracer's ioctl programs are attached. Every path
// attaches without tracefs or debugfs: the ioctl programs through BPF
// trampolines or raw tracepoints, the exit program on the raw
// sched_process_exit tracepoint.
type AttachPath string

const (
	// AttachFentry runs the programs at the entry and exit of the ioctl
	// system call itself (fentry/fexit; kernel 5.5+ on x86-64, 6.0+ on
	// arm64, with BTF): no other system call pays anything.
	AttachFentry AttachPath = "fentry"
	// AttachSyscallTracepoint runs them on the syscalls/sys_enter_ioctl
	// and sys_exit_ioctl tracepoints: while attached, every system call
	// takes the kernel's traced (slower) path, but only ioctl runs a
	// program. Their ids come from tracefs, mounted in a private mount
	// namespace where the host has none (CAP_SYS_ADMIN): the host's mounts
	// never change.
	AttachSyscallTracepoint AttachPath = "syscall-tracepoint"
	// AttachRawSyscall runs them on the raw sys_enter and sys_exit
	// tracepoints (kernel 4.17+): every system call of every process runs a
	// program that returns at once unless it is an ioctl, about twice the
	// cost to unrelated system calls of AttachSyscallTracepoint. The last
	// resort: no BPF trampolines, no tracefs, no CAP_SYS_ADMIN.
	AttachRawSyscall AttachPath = "raw-syscall"
)

// String describes the path for a person, e.g. for `arbiter doctor`.
func (p AttachPath) String() string {
	switch p {
	case AttachFentry:
		return "fentry/fexit on the ioctl system call"
	case AttachSyscallTracepoint:
		return "syscalls/sys_enter_ioctl and sys_exit_ioctl tracepoints"
	case AttachRawSyscall:
		return "raw sys_enter/sys_exit tracepoints"
	}
	return string(p)
}

// ioctlPath is one way to attach the ioctl programs: the programs for the
// system call's entry and exit, and the hooks they attach to (fentry
// programs carry their target in the object).
type ioctlPath struct {
	path  AttachPath
	progs [2]string
	hooks [2]string
}

// attachPaths are the paths in the order NewTracer tries them.
var attachPaths = []ioctlPath{
	{AttachFentry, [2]string{"nvrm_enter", "nvrm_exit"}, [2]string{}},
	{AttachSyscallTracepoint, [2]string{"nvrm_tp_enter", "nvrm_tp_exit"}, [2]string{"syscalls/sys_enter_ioctl", "syscalls/sys_exit_ioctl"}},
	{AttachRawSyscall, [2]string{"nvrm_sys_enter", "nvrm_sys_exit"}, [2]string{"sys_enter", "sys_exit"}},
}

// The names the links are pinned under (link_NAME), whatever the path, so
// that a daemon restarted onto another path replaces them.
var ioctlLinkNames = [2]string{"nvrm_enter", "nvrm_exit"}

// procExitProgram reports the exits of traced processes.
const procExitProgram = "nvrm_proc_exit"

// TracerOptions configures a Tracer; nil means defaults.
type TracerOptions struct {
	// ControlRdev is the device number of the control device whose
	// ioctls are recorded; zero is ControlRdev (195:255).
	ControlRdev Rdev
	// AcceptErrno, where set, also records calls whose ioctl failed with
	// that errno. It exists for a stand-in control file, on which the
	// ioctl fails (ENOTTY) because no driver is behind it but the
	// parameter block holds what the driver would have written back.
	AcceptErrno syscall.Errno
	// PinPath, where set, pins the ring buffer, drop counters and links
	// there: the programs stay attached after the Tracer closes or the
	// daemon dies, and the next Tracer with the same PinPath reads what
	// they recorded meanwhile (up to the ring's 256 KiB, about 2,300
	// calls; past that, drops are counted).
	PinPath string
	// Attach, where set, is the only attach path tried; empty tries
	// AttachFentry, AttachSyscallTracepoint, then AttachRawSyscall, the
	// cheapest for the rest of the node first.
	Attach AttachPath
}

// NewTracer loads and attaches the programs. With a PinPath whose pins a
// previous Tracer left, it reuses the pinned ring buffer (and what it
// holds) and replaces the old links once the new ones are attached, so no
// call goes unrecorded across the switch.
func NewTracer(opts *TracerOptions) (*Tracer, error) {
	t := &Tracer{links: map[string]link.Link{}}
	if opts != nil {
		t.opts = *opts
	}
	if t.opts.ControlRdev == 0 {
		t.opts.ControlRdev = ControlRdev
	}
	spec, err := bpf.LoadNvrm()
	if err != nil {
		return nil, fmt.Errorf("nvrm: load tracer spec: %w", err)
	}
	if err := spec.Variables["ctl_rdev"].Set(uint32(t.opts.ControlRdev)); err != nil {
		return nil, fmt.Errorf("nvrm: set ctl_rdev: %w", err)
	}
	if err := spec.Variables["accept_ret"].Set(-int32(t.opts.AcceptErrno)); err != nil {
		return nil, fmt.Errorf("nvrm: set accept_ret: %w", err)
	}
	var copts ebpf.CollectionOptions
	if t.opts.PinPath == "" {
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
		}
	} else {
		if err := os.MkdirAll(t.opts.PinPath, 0o700); err != nil {
			return nil, fmt.Errorf("nvrm: pin directory (is bpffs mounted at /sys/fs/bpf?): %w", err)
		}
		copts.Maps.PinPath = t.opts.PinPath
	}
	var errs []error
	for _, p := range attachPaths {
		if t.opts.Attach != "" && p.path != t.opts.Attach {
			continue
		}
		err := t.attach(spec, &copts, p)
		if err == nil {
			break
		}
		// Any failure moves on to the next path: an EPERM, say, can be
		// the kernel refusing trampolines as much as missing privilege,
		// and the error names every path's reason if all fail.
		errs = append(errs, fmt.Errorf("%s: %w", p.path, err))
	}
	if t.path == "" {
		if len(errs) == 0 {
			return nil, fmt.Errorf("nvrm: unknown attach path %q (want %q, %q or %q)", t.opts.Attach, AttachFentry, AttachSyscallTracepoint, AttachRawSyscall)
		}
		return nil, fmt.Errorf("nvrm: attach the ioctl tracer: %w", errors.Join(errs...))
	}
	if t.opts.PinPath != "" {
		if err := t.pinLinks(); err != nil {
			t.Close()
			return nil, err
		}
	}
	t.rd, err = ringbuf.NewReader(t.maps.NvrmEvents)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("nvrm: ring buffer reader: %w", err)
	}
	return t, nil
}

// attach loads the maps and the programs of one path and attaches them.
// On failure it leaves t as it found it.
func (t *Tracer) attach(base *ebpf.CollectionSpec, copts *ebpf.CollectionOptions, p ioctlPath) error {
	spec := base.Copy()
	for name := range spec.Programs {
		if name != p.progs[0] && name != p.progs[1] && name != procExitProgram {
			delete(spec.Programs, name)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, *copts)
	if err != nil {
		return fmt.Errorf("load programs (needs root, or CAP_BPF and CAP_PERFMON): %w", err)
	}
	progs := []*ebpf.Program{coll.Programs[p.progs[0]], coll.Programs[p.progs[1]]}
	var ls []link.Link
	switch p.path {
	case AttachFentry:
		for _, prog := range progs {
			var l link.Link
			if l, err = link.AttachTracing(link.TracingOptions{Program: prog}); err != nil {
				err = fmt.Errorf("attach %s: %w", prog, err)
				break
			}
			ls = append(ls, l)
		}
	case AttachSyscallTracepoint:
		ls, err = attachTracepoints(p.hooks[:], progs)
	case AttachRawSyscall:
		for i, prog := range progs {
			var l link.Link
			if l, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: p.hooks[i], Program: prog}); err != nil {
				err = fmt.Errorf("attach %s to the raw tracepoint %s: %w", prog, p.hooks[i], err)
				break
			}
			ls = append(ls, l)
		}
	}
	links := map[string]link.Link{}
	for i, l := range ls {
		links[ioctlLinkNames[i]] = l
	}
	fail := func(err error) error {
		for _, l := range links {
			_ = l.Close()
		}
		coll.Close()
		return err
	}
	if err != nil {
		return fail(err)
	}
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sched_process_exit", Program: coll.Programs[procExitProgram]})
	if err != nil {
		return fail(fmt.Errorf("attach %s to the raw tracepoint sched_process_exit: %w", procExitProgram, err))
	}
	links[procExitProgram] = l
	if err := coll.Assign(&t.maps); err != nil {
		return fail(fmt.Errorf("take the tracer's maps: %w", err))
	}
	t.progs, t.links, t.path = coll, links, p.path
	return nil
}

// AttachPath reports how the ioctl programs are attached.
func (t *Tracer) AttachPath() AttachPath { return t.path }

// pinLinks replaces the links pinned by an earlier Tracer with this one's.
func (t *Tracer) pinLinks() error {
	for name := range t.links {
		path := filepath.Join(t.opts.PinPath, "link_"+name)
		if old, err := link.LoadPinnedLink(path, nil); err == nil {
			// The new link is attached already: drop the old one.
			_ = old.Unpin()
			_ = old.Close()
		} else if !errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(path)
		}
		if err := t.links[name].Pin(path); err != nil {
			return fmt.Errorf("nvrm: pin link %s: %w", path, err)
		}
	}
	return nil
}

// Read blocks until the next traced call (or exit of a traced process) and
// decodes it into ev. It returns ErrClosed after Close, an error wrapping
// os.ErrDeadlineExceeded past a deadline set with SetDeadline, and a
// *DecodeError for a malformed record (the next Read goes on).
func (t *Tracer) Read(ev *trace.Event) error {
	if err := t.rd.ReadInto(&t.rec); err != nil {
		if errors.Is(err, ringbuf.ErrClosed) {
			return ErrClosed
		}
		return err
	}
	if err := Decode(t.rec.RawSample, ev); err != nil {
		t.bad++
		return err
	}
	t.decoded++
	return nil
}

// Pending returns the bytes of records waiting in the ring buffer.
func (t *Tracer) Pending() int { return t.rd.AvailableBytes() }

// SetDeadline makes Read return os.ErrDeadlineExceeded once no record is
// available at t; a zero time removes the deadline.
func (t *Tracer) SetDeadline(d time.Time) { t.rd.SetDeadline(d) }

// Drain reads every record already in the ring buffer, calling fn for
// each, without waiting for more. It returns the number of records.
func (t *Tracer) Drain(fn func(*trace.Event)) (int, error) {
	t.rd.SetDeadline(time.Now())
	defer t.rd.SetDeadline(time.Time{})
	var ev trace.Event
	n := 0
	for {
		err := t.Read(&ev)
		var de *DecodeError
		switch {
		case err == nil:
			fn(&ev)
			n++
		case errors.As(err, &de):
		case errors.Is(err, os.ErrDeadlineExceeded):
			return n, nil
		default:
			return n, err
		}
	}
}

// Stats are the tracer's counters.
type Stats struct {
	// Decoded is the number of records read and decoded, BadRecords the
	// number that failed to decode (by this Tracer).
	Decoded, BadRecords uint64
	// RingbufFull, ReadFailed and InflightFull are the kernel side's
	// drops since the maps were created: records lost to a full ring
	// buffer, parameter blocks unreadable at sys_exit, calls lost to a
	// full in-flight table.
	RingbufFull, ReadFailed, InflightFull uint64
}

// Stats returns the counters.
func (t *Tracer) Stats() (Stats, error) {
	s := Stats{Decoded: t.decoded, BadRecords: t.bad}
	for i, dst := range []*uint64{&s.RingbufFull, &s.ReadFailed, &s.InflightFull} {
		var per []uint64
		if err := t.maps.NvrmDrops.Lookup(uint32(i), &per); err != nil {
			return s, fmt.Errorf("nvrm: read drop counter %d: %w", i, err)
		}
		for _, v := range per {
			*dst += v
		}
	}
	return s, nil
}

// Close detaches the programs (pinned links stay attached and keep
// recording into the pinned ring buffer) and unblocks Read. It is
// idempotent.
func (t *Tracer) Close() error {
	var errs []error
	if t.rd != nil {
		errs = append(errs, t.rd.Close())
		t.rd = nil
	}
	for name, l := range t.links {
		errs = append(errs, l.Close())
		delete(t.links, name)
	}
	if t.progs != nil {
		t.progs.Close()
		t.progs = nil
	}
	errs = append(errs, t.maps.Close())
	return errors.Join(errs...)
}

// Unpin removes the pins under PinPath, so the programs detach once the
// last descriptor closes. Call it before Close to stop tracing for good.
func (t *Tracer) Unpin() error {
	if t.opts.PinPath == "" {
		return nil
	}
	var errs []error
	for _, l := range t.links {
		errs = append(errs, l.Unpin())
	}
	for _, m := range []*ebpf.Map{t.maps.NvrmEvents, t.maps.NvrmSeen, t.maps.NvrmDrops} {
		if m != nil {
			errs = append(errs, m.Unpin())
		}
	}
	errs = append(errs, os.Remove(t.opts.PinPath))
	return errors.Join(errs...)
}

// bpffsMagic is statfs's f_type of a BPF filesystem.
const bpffsMagic = 0xcafe4a11

// MountBPFFS mounts a BPF filesystem at dir (creating dir) unless one is
// mounted there already. Pinning needs one; /sys/fs/bpf is the usual place
// and most distributions mount it at boot.
func MountBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == bpffsMagic {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("nvrm: bpffs mount point: %w", err)
	}
	// A directory made inside a mounted bpffs is already on one.
	if err := unix.Statfs(dir, &st); err == nil && st.Type == bpffsMagic {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("nvrm: mount bpffs at %s (needs root): %w", dir, err)
	}
	return nil
}
