package nvrm

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpu-arbiter/arbiter/internal/caps"
	"github.com/gpu-arbiter/arbiter/sched"
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
	// disableChannels holds what each GPU (device instance) answered to
	// FIFO_DISABLE_CHANNELS: false, NOT_SUPPORTED (no GSP firmware:
	// SuspendAuto goes straight to the per-group controls there); true,
	// it took the channels off (GSP: the per-group controls are accepted
	// and ignored there, so SuspendAuto never falls back to them).
	disableChannels map[uint32]bool
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
	// Respond, where set, answers each control in place of the driver
	// before it is issued: it may fill in params, and returns the status
	// to write into the parameter block (rmstandin.Driver.Answer). With
	// AcceptErrno it lets a stand-in control file refuse calls and
	// return results as the driver would; the answer travels in the
	// block, so a tracer sees it too. Leave it nil on a real driver.
	Respond func(client, object, cmd uint32, params []byte) uint32
	// DriverRoot is where the driver's /proc files are read, to explain
	// NV_ERR_INVALID_CLIENT (DetectClientValidation); empty is "/".
	DriverRoot string
}

// NewController returns a Controller acting on the processes of reg.
func NewController(reg *Registry, opts *ControllerOptions) (*Controller, error) {
	c := &Controller{reg: reg, pidfds: map[uint32]pidfdEntry{}, disableChannels: map[uint32]bool{}, sys: sysIoctl, caps: caps.Effective}
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

// ResetTimeslice gives pid's channel groups on GPU gpu the driver's
// default timeslice back (DefaultTimesliceUs) and stops keeping the one
// SetTimeslice set there: Follow leaves the groups the process makes
// later, and the timeslices it sets itself, alone again.
func (c *Controller) ResetTimeslice(pid uint32, gpu int) error {
	groups, err := c.groups(pid, gpu)
	if err != nil {
		return err
	}
	c.reg.clearDesiredTimeslice(pid, gpu)
	return c.onGroups(pid, groups, func(f *rmFile, g Group) error {
		if err := f.setTimeslice(g, DefaultTimesliceUs); err != nil {
			return err
		}
		c.reg.setGroup(pid, g, func(o *object) { o.Timeslice, o.TimesliceBy = DefaultTimesliceUs, "arbiter" })
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
func (c *Controller) SetInterleave(pid uint32, level sched.Interleave) error {
	if level > sched.InterleaveHigh {
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
