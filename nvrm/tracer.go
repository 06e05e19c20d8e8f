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
var ErrClosed = os.ErrClosed

// DefaultPinPath is where a daemon pins the tracer's ring buffer, maps and
// links so that they outlive it (bpffs must be mounted at /sys/fs/bpf).
const DefaultPinPath = "/sys/fs/bpf/arbiter/nvrm"

// Tracer records RM allocations, frees and channel-group controls issued
// on the driver's control device, with eBPF programs on the ioctl syscall
// tracepoints (kernel 5.8+ for the ring buffer, CAP_BPF and CAP_PERFMON or
// root). One Tracer reads one ring buffer; Read is not safe for concurrent
// use, Close may be called from any goroutine and unblocks Read.
type Tracer struct {
	objs  bpf.NvrmObjects
	links map[string]link.Link
	rd    *ringbuf.Reader
	rec   ringbuf.Record
	opts  TracerOptions
	// Decoded counts records read, BadRecords those that failed to decode.
	decoded, bad uint64
}

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
}

// Programs and where they attach.
var tracerAttach = []struct{ name, group, event string }{
	{"nvrm_enter", "syscalls", "sys_enter_ioctl"},
	{"nvrm_exit", "syscalls", "sys_exit_ioctl"},
	{"nvrm_proc_exit", "sched", "sched_process_exit"},
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
	if err := spec.LoadAndAssign(&t.objs, &copts); err != nil {
		return nil, fmt.Errorf("nvrm: load tracer programs (needs root, or CAP_BPF and CAP_PERFMON): %w", err)
	}
	progs := map[string]*ebpf.Program{
		"nvrm_enter":     t.objs.NvrmEnter,
		"nvrm_exit":      t.objs.NvrmExit,
		"nvrm_proc_exit": t.objs.NvrmProcExit,
	}
	for _, a := range tracerAttach {
		l, err := link.Tracepoint(a.group, a.event, progs[a.name], nil)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("nvrm: attach %s to %s:%s: %w", a.name, a.group, a.event, err)
		}
		t.links[a.name] = l
	}
	if t.opts.PinPath != "" {
		if err := t.pinLinks(); err != nil {
			t.Close()
			return nil, err
		}
	}
	t.rd, err = ringbuf.NewReader(t.objs.NvrmEvents)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("nvrm: ring buffer reader: %w", err)
	}
	return t, nil
}

// pinLinks replaces the links pinned by an earlier Tracer with this one's.
func (t *Tracer) pinLinks() error {
	for _, a := range tracerAttach {
		path := filepath.Join(t.opts.PinPath, "link_"+a.name)
		if old, err := link.LoadPinnedLink(path, nil); err == nil {
			// The new link is attached already: drop the old one.
			_ = old.Unpin()
			_ = old.Close()
		} else if !errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(path)
		}
		if err := t.links[a.name].Pin(path); err != nil {
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
		if err := t.objs.NvrmDrops.Lookup(uint32(i), &per); err != nil {
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
	errs = append(errs, t.objs.Close())
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
	for _, m := range []*ebpf.Map{t.objs.NvrmEvents, t.objs.NvrmSeen, t.objs.NvrmDrops} {
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
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("nvrm: mount bpffs at %s (needs root): %w", dir, err)
	}
	return nil
}
