package nvrm

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/caps"
)

// Errors of channel control, besides the driver's own statuses.
var (
	// ErrProcessExited is returned when the target process is gone (or
	// its pid now names another process).
	ErrProcessExited = errors.New("process exited")
	// ErrNotControlFile is returned when the target's descriptor is not
	// the driver's control device (closed and reused since it was traced).
	ErrNotControlFile = errors.New("descriptor is not the driver's control device")
	// ErrCallTimeout is returned when the driver did not answer within
	// ControllerOptions.Timeout.
	ErrCallTimeout = errors.New("driver call timed out")
	// ErrNoGroups is returned when a traced process has no channel group
	// on the GPU asked for.
	ErrNoGroups = errors.New("no channel groups traced on that GPU")
)

// DefaultCallTimeout bounds one driver call. RM controls on a GSP GPU are
// a synchronous RPC that takes well under a millisecond; PREEMPT with
// bWait waits for the context switch, up to the timeout Arbiter sends with
// it (DefaultPreemptTimeout), which this bound must exceed.
const DefaultCallTimeout = 2 * time.Second

// DefaultPreemptTimeout is the timeout sent with each PREEMPT
// (bManualTimeout), the largest the driver accepts. Without one the
// firmware's own default applies and the driver's CPU side waits up to 1.5
// times RM's default timeout: 6 s in graphics mode, 45 s in compute mode.
const DefaultPreemptTimeout = MaxPreemptTimeoutUs * time.Microsecond

// Controller issues channel-group controls on other processes' RM objects,
// through each process's own control file. Its methods are safe for
// concurrent use.
type Controller struct {
	reg  *Registry
	opts ControllerOptions
	// sys issues ioctls; tests replace it to hold a call.
	sys func(fd int, req uint32, arg unsafe.Pointer) syscall.Errno
	// caps reads this process's effective capabilities; tests replace it.
	caps func() (caps.Set, error)

	mu sync.Mutex
	// pidfds holds one pidfd per controlled process, opened once and
	// checked against the process's traced start time then: it names that
	// process for good, so later calls need no /proc read to rule out a
	// reused pid. It does not hold the process's GPU resources.
	pidfds map[uint32]pidfdEntry
}

type pidfdEntry struct {
	fd    int
	start uint64
}

// ControllerOptions configures a Controller. Only Layout has no default.
type ControllerOptions struct {
	// Layout is the driver's parameter layouts (DetectLayout).
	Layout Layout
	// ControlRdev is the device number a target's descriptor must have;
	// zero means ControlRdev (195:255). Tests point it at a stand-in.
	ControlRdev Rdev
	// Timeout bounds each driver call (zero: DefaultCallTimeout). The
	// ioctl cannot be cancelled: past the timeout the operation returns
	// ErrCallTimeout, issues no further call, and closes the duplicated
	// descriptor when the driver returns. It must exceed PreemptTimeout.
	Timeout time.Duration
	// PreemptTimeout is the timeout sent with each PREEMPT, which the
	// driver waits for at most (zero: DefaultPreemptTimeout, or half of
	// Timeout where that is less). It may not exceed MaxPreemptTimeoutUs
	// and must be below Timeout.
	PreemptTimeout time.Duration
	// AcceptErrno, where set, treats an ioctl failing with that errno as
	// one RM ran, and reads the status from the parameter block. It
	// exists for a stand-in control file, where no driver answers
	// (ENOTTY), so that whole control sequences can be exercised.
	AcceptErrno syscall.Errno
}

// NewController returns a Controller acting on the processes of reg.
func NewController(reg *Registry, opts *ControllerOptions) (*Controller, error) {
	c := &Controller{reg: reg, pidfds: map[uint32]pidfdEntry{}, sys: sysIoctl, caps: caps.Effective}
	if opts != nil {
		c.opts = *opts
	}
	if c.opts.Layout.ScheduleSize != 2 && c.opts.Layout.ScheduleSize != 3 {
		return nil, fmt.Errorf("nvrm: controller: no driver layout (GPFIFO_SCHEDULE size %d): use DetectLayout", c.opts.Layout.ScheduleSize)
	}
	if c.opts.ControlRdev == 0 {
		c.opts.ControlRdev = ControlRdev
	}
	if c.opts.Timeout <= 0 {
		c.opts.Timeout = DefaultCallTimeout
	}
	if c.opts.PreemptTimeout <= 0 {
		c.opts.PreemptTimeout = min(DefaultPreemptTimeout, c.opts.Timeout/2)
	}
	switch {
	case c.opts.PreemptTimeout > MaxPreemptTimeoutUs*time.Microsecond:
		return nil, fmt.Errorf("nvrm: controller: PREEMPT timeout %v exceeds the driver's limit of %v", c.opts.PreemptTimeout, MaxPreemptTimeoutUs*time.Microsecond)
	case c.opts.PreemptTimeout < time.Microsecond:
		return nil, fmt.Errorf("nvrm: controller: PREEMPT timeout %v is below the driver's unit of 1µs", c.opts.PreemptTimeout)
	case c.opts.Timeout <= c.opts.PreemptTimeout:
		return nil, fmt.Errorf("nvrm: controller: call timeout %v must exceed the PREEMPT timeout %v, which a PREEMPT may take", c.opts.Timeout, c.opts.PreemptTimeout)
	}
	return c, nil
}

// Registry returns the registry the controller acts on.
func (c *Controller) Registry() *Registry { return c.reg }

// SetTimeslice sets the timeslice of pid's channel groups on GPU gpu
// (every GPU where gpu < 0) to us microseconds, and keeps it: Follow
// re-applies it when the process sets its own. It returns the first
// driver status that was not NV_OK, as a *StatusError.
func (c *Controller) SetTimeslice(pid uint32, gpu int, us uint64) error {
	groups, err := c.groups(pid, gpu)
	if err != nil {
		return err
	}
	c.reg.setDesiredTimeslice(pid, gpu, us)
	return c.onGroups(pid, groups, func(f *rmFile, g Group) error {
		if err := f.setTimeslice(g, us); err != nil {
			return err
		}
		c.reg.setGroup(pid, g, func(o *object) { o.Timeslice, o.TimesliceBy = us, "arbiter" })
		return nil
	})
}

// Timeslice reads the timeslice of each of pid's channel groups on GPU gpu
// (GET_TIMESLICE: the last value set, not the hardware's rounding).
func (c *Controller) Timeslice(pid uint32, gpu int) (map[uint32]uint64, error) {
	groups, err := c.groups(pid, gpu)
	if err != nil {
		return nil, err
	}
	out := map[uint32]uint64{}
	err = c.onGroups(pid, groups, func(f *rmFile, g Group) error {
		p := TimesliceParams{}
		if err := f.control(g, CtrlGetTimeslice, unsafe.Pointer(&p), uint32(unsafe.Sizeof(p))); err != nil {
			return err
		}
		out[g.Handle] = p.TimesliceUs
		return nil
	})
	if errors.Is(err, ErrCallTimeout) {
		return nil, err // the worker may still write to out
	}
	return out, err
}

// SetInterleave sets the interleave level of all of pid's channel groups
// and records it in the registry, which is the only record of it: the
// driver does not export GET_INTERLEAVE_LEVEL. The driver grants
// SET_INTERLEAVE_LEVEL (RS_ACCESS_NICE) only to a caller with
// CAP_SYS_ADMIN or CAP_SYS_NICE; without either, SetInterleave returns a
// *caps.MissingError before issuing anything.
func (c *Controller) SetInterleave(pid uint32, level InterleaveLevel) error {
	if level > InterleaveHigh {
		return fmt.Errorf("nvrm: interleave level %d: want 0 (low), 1 (medium) or 2 (high)", uint32(level))
	}
	if err := c.requireNice(); err != nil {
		return err
	}
	groups, err := c.groups(pid, -1)
	if err != nil {
		return err
	}
	return c.onGroups(pid, groups, func(f *rmFile, g Group) error {
		p := InterleaveParams{Level: uint32(level)}
		err := f.control(g, CtrlSetInterleaveLevel, unsafe.Pointer(&p), uint32(unsafe.Sizeof(p)))
		switch {
		case errors.Is(err, ErrInsufficientPermissions):
			return fmt.Errorf("%w (the driver grants it to a caller with CAP_SYS_NICE or CAP_SYS_ADMIN)", err)
		case errors.Is(err, ErrNotSupported):
			return fmt.Errorf("%w (on a GSP GPU, the firmware's refusal of the level)", err)
		case err != nil:
			return err
		}
		c.reg.setGroup(pid, g, func(o *object) { o.Interleave = int32(level) })
		return nil
	})
}

// requireNice checks that this process holds what the driver's
// RS_ACCESS_NICE needs: CAP_SYS_NICE or CAP_SYS_ADMIN, in the calling
// process (not the target's). Without, the driver refuses each group with
// NV_ERR_INSUFFICIENT_PERMISSIONS, or NOT_SUPPORTED on a GSP GPU.
func (c *Controller) requireNice() error {
	have, err := c.caps()
	if err != nil {
		return fmt.Errorf("nvrm: interleave level: %w", err)
	}
	err = caps.Check(have, "setting a channel group's interleave level (SET_INTERLEAVE_LEVEL)", caps.SysNice)
	var me *caps.MissingError
	if errors.As(err, &me) {
		me.Hint = "or grant CAP_SYS_ADMIN, which the driver accepts as well"
	}
	return err
}

// Suspend takes pid's channel groups on GPU gpu (every GPU where gpu < 0)
// off the GPU: scheduling disabled (GPFIFO_SCHEDULE{bEnable=0}), then
// preempted (PREEMPT{bWait=1}). The groups are recorded as suspended (in
// the registry's state directory, where it keeps state) before the first
// control, so that a crash cannot leave them suspended unnoticed:
// ResumeAll at the next start resumes them.
func (c *Controller) Suspend(pid uint32, gpu int) error {
	groups, err := c.groups(pid, gpu)
	if err != nil {
		return err
	}
	if err := c.reg.markSuspended(pid, groups); err != nil {
		return err
	}
	err = c.onGroups(pid, groups, func(f *rmFile, g Group) error {
		if err := f.schedule(g, false, c.opts.Layout.ScheduleSize); err != nil {
			return err
		}
		c.reg.setGroup(pid, g, func(o *object) { o.Disabled = true })
		return f.preempt(g)
	})
	if errors.Is(err, ErrProcessExited) {
		c.reg.Forget(pid)
		_ = c.reg.Save()
	}
	return err
}

// Resume schedules pid's channel groups on GPU gpu again
// (GPFIFO_SCHEDULE{bEnable=1}) and forgets that they were suspended.
func (c *Controller) Resume(pid uint32, gpu int) error {
	groups, err := c.groups(pid, gpu)
	if err != nil {
		return err
	}
	err = c.onGroups(pid, groups, func(f *rmFile, g Group) error {
		if err := f.schedule(g, true, c.opts.Layout.ScheduleSize); err != nil {
			return err
		}
		c.reg.setGroup(pid, g, func(o *object) { o.Disabled = false })
		return nil
	})
	if errors.Is(err, ErrProcessExited) {
		// Nothing left to resume.
		c.reg.Forget(pid)
		return errors.Join(err, c.reg.Save())
	}
	if err == nil {
		err = c.reg.clearSuspended(pid, groups)
	}
	return err
}

// ResumeAll resumes every channel group the registry holds suspended: at
// start, those a previous run left behind; at a clean exit, its own. It
// returns the errors of the groups it could not resume; a process that
// exited meanwhile is not an error.
func (c *Controller) ResumeAll() error {
	byPID := map[uint32][]Group{}
	starts := map[uint32]uint64{}
	for _, s := range c.reg.Suspended() {
		byPID[s.PID] = append(byPID[s.PID], s.Group)
		starts[s.PID] = s.StartTime
	}
	var errs []error
	for pid, groups := range byPID {
		err := c.onGroupsOf(pid, starts[pid], groups, func(f *rmFile, g Group) error {
			return f.schedule(g, true, c.opts.Layout.ScheduleSize)
		})
		switch {
		case errors.Is(err, ErrProcessExited):
			c.reg.Forget(pid)
		case err != nil:
			errs = append(errs, fmt.Errorf("resume process %d: %w", pid, err))
			continue
		}
		if err := c.reg.clearSuspended(pid, groups); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Follow keeps Arbiter's settings on a process after the registry applied
// an event: a new channel group, or the process setting its own timeslice
// (CUDA applies the node's compute policy to its TSGs), gets the timeslice
// Arbiter keeps for it again. It returns nil where there is nothing to do.
func (c *Controller) Follow(ch Change) error {
	if ch.Kind == ChangeExit {
		c.dropPidfd(ch.PID)
		return nil
	}
	if ch.Kind != ChangeNewGroup && ch.Kind != ChangeTimeslice {
		return nil
	}
	us, ok := c.reg.desiredTimeslice(ch.PID, ch.Group.Instance)
	if !ok || (ch.Kind == ChangeTimeslice && ch.Group.Timeslice == us) {
		return nil
	}
	g := ch.Group
	return c.onGroups(ch.PID, []Group{g}, func(f *rmFile, g Group) error {
		if err := f.setTimeslice(g, us); err != nil {
			return err
		}
		c.reg.setGroup(ch.PID, g, func(o *object) { o.Timeslice, o.TimesliceBy = us, "arbiter" })
		return nil
	})
}

// groups returns pid's channel groups on gpu, at least one.
func (c *Controller) groups(pid uint32, gpu int) ([]Group, error) {
	groups, err := c.reg.Groups(pid, gpu)
	if err != nil {
		return nil, err
	}
	if len(groups) == 0 {
		return nil, fmt.Errorf("nvrm: process %d, GPU %d: %w", pid, gpu, ErrNoGroups)
	}
	return groups, nil
}

// onGroups runs fn on each group through pid's control files (one
// duplicate per client descriptor), on one worker goroutine so that the
// caller gets control back if the driver does not answer: each ioctl may
// take up to Timeout, after which the caller gets ErrCallTimeout, and the
// worker stops at the stuck call and closes the duplicates once the driver
// returns. One worker per operation rather than per ioctl: a thread
// hand-off costs a futex wake-up, microseconds on a virtualized host, and
// a suspend is several controls in a row.
func (c *Controller) onGroups(pid uint32, groups []Group, fn func(*rmFile, Group) error) error {
	start, err := c.reg.startTime(pid)
	if err != nil {
		return err
	}
	return c.onGroupsOf(pid, start, groups, fn)
}

// onGroupsOf is onGroups for a process known by its start time, which a
// suspension record carries even where the registry lost the process.
func (c *Controller) onGroupsOf(pid uint32, start uint64, groups []Group, fn func(*rmFile, Group) error) error {
	w := &callWatch{base: time.Now()}
	done := make(chan error, 1)
	go func() { done <- c.runGroups(pid, start, groups, fn, w) }()
	t := time.NewTimer(c.opts.Timeout)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
			inFlight := w.inFlight()
			if inFlight >= c.opts.Timeout {
				w.abandoned.Store(true)
				return fmt.Errorf("nvrm: process %d: driver call still running after %v: %w", pid, c.opts.Timeout, ErrCallTimeout)
			}
			t.Reset(c.opts.Timeout - inFlight)
		}
	}
}

// runGroups is onGroups' worker.
func (c *Controller) runGroups(pid uint32, start uint64, groups []Group, fn func(*rmFile, Group) error, w *callWatch) error {
	files := map[int32]*rmFile{}
	defer func() {
		for _, f := range files {
			f.close()
		}
	}()
	for _, g := range groups {
		f := files[g.FD]
		if f == nil {
			var err error
			if f, err = c.open(pid, start, g.FD); err != nil {
				return err
			}
			f.watch = w
			files[g.FD] = f
		}
		if err := fn(f, g); err != nil {
			return fmt.Errorf("nvrm: process %d, channel group %#x: %w", pid, g.Handle, err)
		}
	}
	return nil
}

// callWatch lets the waiting caller see how long the worker's current
// ioctl has run, without a hand-off per call.
type callWatch struct {
	base time.Time
	// started is when the ioctl in flight started (ns after base, +1),
	// 0 between calls.
	started atomic.Int64
	// abandoned is set when the caller gave up: the worker issues no
	// further calls.
	abandoned atomic.Bool
}

// inFlight returns how long the current ioctl has run, 0 if none runs.
func (w *callWatch) inFlight() time.Duration {
	s := w.started.Load()
	if s == 0 {
		return 0
	}
	return time.Since(w.base) - time.Duration(s-1)
}

// rmFile is a duplicate of a process's control file, owned by one
// Controller operation's worker.
type rmFile struct {
	fd     int
	accept syscall.Errno
	// sys issues the ioctl; tests replace it.
	sys func(fd int, req uint32, arg unsafe.Pointer) syscall.Errno
	// watch, where set, tells the waiting caller about calls in flight.
	watch *callWatch
	// preemptUs is the timeout sent with PREEMPT.
	preemptUs uint32
}

// open duplicates descriptor fd of process pid (started at start), through
// a pidfd that pins the process: a pid reused after an exit is refused
// rather than controlled.
func (c *Controller) open(pid uint32, start uint64, fd int32) (*rmFile, error) {
	pidfd, err := c.pidfd(pid, start)
	if err != nil {
		return nil, err
	}
	dup, err := unix.PidfdGetfd(pidfd, int(fd), 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		c.dropPidfd(pid)
		return nil, fmt.Errorf("nvrm: process %d: %w", pid, ErrProcessExited)
	case errors.Is(err, unix.EBADF):
		return nil, fmt.Errorf("nvrm: process %d descriptor %d: %w (closed since traced)", pid, fd, ErrNotControlFile)
	case errors.Is(err, unix.EPERM):
		return nil, fmt.Errorf("nvrm: pidfd_getfd process %d descriptor %d: %w (needs root or CAP_SYS_PTRACE, and Yama ptrace_scope below 3)", pid, fd, err)
	case err != nil:
		return nil, fmt.Errorf("nvrm: pidfd_getfd process %d descriptor %d: %w", pid, fd, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(dup, &st); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("nvrm: fstat process %d descriptor %d: %w", pid, fd, err)
	}
	got := MkRdev(unix.Major(st.Rdev), unix.Minor(st.Rdev))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || got != c.opts.ControlRdev {
		unix.Close(dup)
		return nil, fmt.Errorf("nvrm: process %d descriptor %d is %s, want char %s: %w", pid, fd, got, c.opts.ControlRdev, ErrNotControlFile)
	}
	return &rmFile{fd: dup, accept: c.opts.AcceptErrno, sys: c.sys, preemptUs: uint32(c.opts.PreemptTimeout / time.Microsecond)}, nil
}

// pidfd returns the cached pidfd of pid, opening and checking it first.
func (c *Controller) pidfd(pid uint32, start uint64) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.pidfds[pid]; ok && e.start == start {
		return e.fd, nil
	} else if ok {
		unix.Close(e.fd)
		delete(c.pidfds, pid)
	}
	fd, err := unix.PidfdOpen(int(pid), unix.PIDFD_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return -1, fmt.Errorf("nvrm: process %d: %w", pid, ErrProcessExited)
		}
		return -1, fmt.Errorf("nvrm: pidfd_open %d: %w", pid, err)
	}
	// The pidfd now names one process; check it is the one traced.
	if now := c.reg.opts.StartTime(pid); now == 0 || (start != 0 && now != start) {
		unix.Close(fd)
		return -1, fmt.Errorf("nvrm: process %d: %w (pid reused)", pid, ErrProcessExited)
	}
	c.pidfds[pid] = pidfdEntry{fd: fd, start: start}
	return fd, nil
}

// dropPidfd closes pid's cached pidfd.
func (c *Controller) dropPidfd(pid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.pidfds[pid]; ok {
		unix.Close(e.fd)
		delete(c.pidfds, pid)
	}
}

// Close releases the controller's pidfds. It does not resume anything:
// call ResumeAll first on a clean exit.
func (c *Controller) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for pid, e := range c.pidfds {
		unix.Close(e.fd)
		delete(c.pidfds, pid)
	}
	return nil
}

// close closes the duplicate.
func (f *rmFile) close() { unix.Close(f.fd) }

// control issues RM_CONTROL cmd on group g with params of size bytes and
// returns the driver's status as an error. It never issues
// GET_INTERLEAVE_LEVEL, which no driver exports.
func (f *rmFile) control(g Group, cmd Control, params unsafe.Pointer, size uint32) error {
	if cmd == CtrlGetInterleaveLevel {
		return fmt.Errorf("%s: %w: no driver exports it; the registry records the level set", cmd, ErrNotSupported)
	}
	req := &NVOS54{HClient: g.Client, HObject: g.Handle, Cmd: uint32(cmd), Params: uint64(uintptr(params)), ParamsSize: size}
	if err := f.ioctl(ReqRMControl, unsafe.Pointer(req), params); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	if err := Status(req.Status).Err(); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	return nil
}

func (f *rmFile) setTimeslice(g Group, us uint64) error {
	p := TimesliceParams{TimesliceUs: us}
	return f.control(g, CtrlSetTimeslice, unsafe.Pointer(&p), uint32(unsafe.Sizeof(p)))
}

// preempt takes g off the GPU, waiting for it (bWait) up to the
// controller's PREEMPT timeout, which it sends explicitly.
func (f *rmFile) preempt(g Group) error {
	p := PreemptParams{BWait: 1, BManualTimeout: 1, TimeoutUs: f.preemptUs}
	return f.control(g, CtrlPreempt, unsafe.Pointer(&p), uint32(unsafe.Sizeof(p)))
}

func (f *rmFile) schedule(g Group, enable bool, size uint32) error {
	p := ScheduleParams{}
	if enable {
		p.BEnable = 1
	}
	return f.control(g, CtrlGPFIFOSchedule, unsafe.Pointer(&p), size)
}

// ioctl runs one ioctl on the duplicate. params is the memory the
// request points to, kept alive across the call.
func (f *rmFile) ioctl(req uint32, arg, params unsafe.Pointer) error {
	if f.watch != nil {
		if f.watch.abandoned.Load() {
			return ErrCallTimeout
		}
		f.watch.started.Store(int64(time.Since(f.watch.base)) + 1)
		defer f.watch.started.Store(0)
	}
	e := f.sys(f.fd, req, arg)
	runtime.KeepAlive(params)
	if e != 0 && (f.accept == 0 || e != f.accept) {
		return os.NewSyscallError("ioctl", e)
	}
	return nil
}

// sysIoctl is the ioctl system call.
func sysIoctl(fd int, req uint32, arg unsafe.Pointer) syscall.Errno {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	return e
}
