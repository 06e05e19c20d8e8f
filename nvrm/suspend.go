package nvrm

import (
	"errors"
	"fmt"
)

// SuspendMethod is how Suspend takes channel groups off the GPU.
type SuspendMethod uint8

// Suspend methods.
const (
	// SuspendAuto uses SuspendDisableChannels where it can name every
	// channel of a GPU's groups and the GPU answers it, else
	// SuspendSchedule. A GPU that answered FIFO_DISABLE_CHANNELS with
	// NOT_SUPPORTED (one not run by GSP firmware) is remembered and goes
	// straight to SuspendSchedule afterwards. A GPU that took channels
	// off with it is remembered too: it runs GSP firmware, where
	// SuspendSchedule does nothing, so where a process's channels there
	// cannot all be named, Suspend refuses (ErrNoSuspendPath) rather than
	// fall back.
	SuspendAuto SuspendMethod = iota
	// SuspendSchedule disables each channel group's scheduling
	// (GPFIFO_SCHEDULE{bEnable=0}) and preempts it (PREEMPT, waiting):
	// two controls per group. Resume schedules the groups again. For
	// GPUs without GSP: on an H100 with GSP firmware (driver 580.159.04)
	// the driver accepted both controls and the group's kernel kept
	// running (docs/nvrm.md).
	SuspendSchedule
	// SuspendDisableChannels lists the groups' channels, up to 64 per
	// call, in FIFO_DISABLE_CHANNELS on the process's own subdevice: the
	// channels are preempted and will not run until re-enabled, one
	// control for a whole GPU. GSP GPUs only (H100 and other GSP-based
	// GPUs); elsewhere the driver answers NOT_SUPPORTED. Resume
	// re-enables the channels the same way.
	SuspendDisableChannels
)

// ErrNoSuspendPath is returned by Suspend (SuspendAuto) for a GPU known to
// run GSP firmware (it answered FIFO_DISABLE_CHANNELS) where the process's
// channels cannot all be named: FIFO_DISABLE_CHANNELS would leave the
// unnamed ones running, and the per-group controls, which the driver
// accepts there, do not stop the GPU's work (seen on an H100). Nothing is
// changed; the caller falls back to a weaker enforcement.
var ErrNoSuspendPath = errors.New("no suspend path this GPU honours")

// String returns "auto", "schedule" or "disable-channels".
func (m SuspendMethod) String() string {
	switch m {
	case SuspendAuto:
		return "auto"
	case SuspendSchedule:
		return "schedule"
	case SuspendDisableChannels:
		return "disable-channels"
	}
	return fmt.Sprintf("method(%d)", uint8(m))
}

// ParseSuspendMethod accepts "auto", "schedule" or "disable-channels".
func ParseSuspendMethod(s string) (SuspendMethod, error) {
	for _, m := range []SuspendMethod{SuspendAuto, SuspendSchedule, SuspendDisableChannels} {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("nvrm: suspend method %q: want auto, schedule or disable-channels", s)
}

// MarshalText writes the method's name, as suspension records hold it.
func (m SuspendMethod) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText reads a method's name.
func (m *SuspendMethod) UnmarshalText(b []byte) error {
	v, err := ParseSuspendMethod(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// SuspendOptions configures SuspendWith; nil means the defaults.
type SuspendOptions struct {
	// Method chooses how (zero: SuspendAuto). The hardware procedure
	// times each method on its own.
	Method SuspendMethod
}

// SuspendStep says how one GPU's channel groups of a process (those of
// one client) were suspended.
type SuspendStep struct {
	// GPU is the device instance.
	GPU uint32
	// Method is the method that ran: SuspendSchedule or
	// SuspendDisableChannels.
	Method SuspendMethod
	// Groups is the number of channel groups.
	Groups int
	// FellBack is set where FIFO_DISABLE_CHANNELS answered NOT_SUPPORTED
	// and the per-group controls ran instead.
	FellBack bool
}

// Suspend takes pid's channel groups on GPU gpu (every GPU where gpu < 0)
// off the GPU, with SuspendAuto; see SuspendWith.
func (c *Controller) Suspend(pid uint32, gpu int) error {
	_, err := c.SuspendWith(pid, gpu, nil)
	return err
}

// SuspendWith takes pid's channel groups on GPU gpu (every GPU where
// gpu < 0) off the GPU with the method opts chooses, and returns how each
// GPU's groups were suspended. The groups are recorded as suspended (in
// the registry's state directory, where it keeps state) before the first
// control, so that a crash cannot leave them suspended unnoticed:
// ResumeAll at the next start resumes them. A group that fails does not
// stop the others: every group is tried, the errors are joined, and the
// record stays for all of them, so that Resume or ResumeAll undoes
// whatever did take effect.
func (c *Controller) SuspendWith(pid uint32, gpu int, opts *SuspendOptions) ([]SuspendStep, error) {
	method := SuspendAuto
	if opts != nil {
		method = opts.Method
	}
	if method > SuspendDisableChannels {
		return nil, fmt.Errorf("nvrm: suspend method %d: want SuspendAuto, SuspendSchedule or SuspendDisableChannels", method)
	}
	groups, err := c.groups(pid, gpu)
	if err != nil {
		return nil, err
	}
	p, err := c.reg.Process(pid)
	if err != nil {
		return nil, err
	}
	plans, err := c.planSuspend(p, groups, method)
	if err != nil {
		return nil, err
	}
	var recs []SuspendedGroup
	for i := range plans {
		recs = append(recs, plans[i].records(pid, p.StartTime)...)
	}
	if err := c.reg.markSuspended(recs); err != nil {
		return nil, err
	}
	finished, err := c.run(pid, p.StartTime, func(s *session) error {
		return c.suspendOn(s, plans, method == SuspendAuto)
	})
	if errors.Is(err, ErrProcessExited) {
		c.reg.Forget(pid)
		_ = c.reg.Save()
	}
	if !finished {
		return nil, err
	}
	steps := make([]SuspendStep, len(plans))
	for i, d := range plans {
		steps[i] = SuspendStep{GPU: d.instance, Method: d.method, Groups: len(d.groups), FellBack: d.fellBack}
	}
	return steps, c.explainInvalidClient(pid, err)
}

// devicePlan is one client's channel groups on one GPU, and how to
// suspend or resume them.
type devicePlan struct {
	fd                                  int32
	client, device, subdevice, instance uint32
	method                              SuspendMethod
	fellBack                            bool
	groups                              []Group
}

// planSuspend splits groups by client and device and chooses each one's
// method.
func (c *Controller) planSuspend(p Process, groups []Group, method SuspendMethod) ([]devicePlan, error) {
	subdevice := map[[2]uint32]uint32{}
	for _, cl := range p.Clients {
		for _, d := range cl.Devices {
			if len(d.Subdevices) > 0 {
				subdevice[[2]uint32{cl.Handle, d.Handle}] = d.Subdevices[0]
			}
		}
	}
	plans := planDevices(groups, func(g Group) (SuspendMethod, uint32) {
		return method, subdevice[[2]uint32{g.Client, g.Device}]
	})
	for i := range plans {
		d := &plans[i]
		why := d.cannotDisable()
		switch {
		case method == SuspendSchedule:
		case method == SuspendDisableChannels && why != "":
			return nil, fmt.Errorf("nvrm: process %d, GPU %d: FIFO_DISABLE_CHANNELS cannot be used: %s (use the schedule method)", p.PID, d.instance, why)
		case method == SuspendDisableChannels:
		case why == "" && c.disableChannelsAnswer(d.instance) != answerRefused:
			d.method = SuspendDisableChannels
		case c.disableChannelsAnswer(d.instance) == answerHonoured:
			return nil, fmt.Errorf("nvrm: process %d, GPU %d: %w: FIFO_DISABLE_CHANNELS cannot name every channel (%s), and the per-group controls are accepted and ignored on this GPU, which runs GSP firmware (it answered FIFO_DISABLE_CHANNELS): not suspended (--method schedule forces them)", p.PID, d.instance, ErrNoSuspendPath, why)
		default:
			d.method = SuspendSchedule
		}
	}
	return plans, nil
}

// planDevices groups gs by client, device and method, in order; of
// returns a group's method and subdevice.
func planDevices(gs []Group, of func(Group) (SuspendMethod, uint32)) []devicePlan {
	var plans []devicePlan
	idx := map[[3]uint32]int{}
	for _, g := range gs {
		m, sub := of(g)
		k := [3]uint32{g.Client, g.Device, uint32(m)}
		i, ok := idx[k]
		if !ok {
			i = len(plans)
			idx[k] = i
			plans = append(plans, devicePlan{fd: g.FD, client: g.Client, device: g.Device, subdevice: sub, instance: g.Instance, method: m})
		}
		plans[i].groups = append(plans[i].groups, g)
	}
	return plans
}

// cannotDisable says why FIFO_DISABLE_CHANNELS cannot stand in for the
// per-group controls on d, "" if it can: it needs the process's subdevice,
// and the channels of every group, since a channel it does not list keeps
// running.
func (d *devicePlan) cannotDisable() string {
	if d.subdevice == 0 {
		return "no subdevice of the process was traced on this GPU"
	}
	for _, g := range d.groups {
		if len(g.Channels) == 0 {
			return fmt.Sprintf("no channel of channel group %#x was traced", g.Handle)
		}
	}
	return ""
}

// channels returns the channels of d's groups.
func (d *devicePlan) channels() []uint32 {
	var out []uint32
	for _, g := range d.groups {
		for _, ch := range g.Channels {
			out = append(out, ch.Handle)
		}
	}
	return out
}

// records returns the suspension records of d's groups.
func (d *devicePlan) records(pid uint32, start uint64) []SuspendedGroup {
	out := make([]SuspendedGroup, len(d.groups))
	for i, g := range d.groups {
		out[i] = SuspendedGroup{PID: pid, StartTime: start, Group: g, Method: d.method}
		if d.method == SuspendDisableChannels {
			out[i].Subdevice = d.subdevice
		}
	}
	return out
}

// suspendOn is SuspendWith's worker: each GPU's groups by their method,
// going on past failures. Under SuspendAuto, a GPU that answers
// FIFO_DISABLE_CHANNELS with NOT_SUPPORTED falls back to the per-group
// controls, its records rewritten first.
func (c *Controller) suspendOn(s *session, plans []devicePlan, auto bool) error {
	var errs []error
	for i := range plans {
		d := &plans[i]
		if d.method == SuspendDisableChannels {
			err := s.disable(d, true)
			switch {
			case err == nil:
				c.noteDisableChannels(d.instance, answerHonoured)
				continue
			case auto && errors.Is(err, ErrNotSupported):
				c.noteDisableChannels(d.instance, answerRefused)
				d.method, d.fellBack = SuspendSchedule, true
				if err := c.reg.markSuspended(d.records(s.pid, s.start)); err != nil {
					errs = append(errs, err)
					continue
				}
			default:
				errs = append(errs, err)
				if stopsRun(err) {
					return errors.Join(errs...)
				}
				continue
			}
		}
		_, err := s.eachGroup(d.groups, func(f *rmFile, g Group) error {
			if err := f.schedule(g, false, c.opts.Layout.ScheduleSize); err != nil {
				return err
			}
			c.reg.setGroup(s.pid, g, func(o *object) { o.Disabled = true })
			return f.preempt(g)
		})
		if err != nil {
			errs = append(errs, err)
			if stopsRun(err) {
				break
			}
		}
	}
	return errors.Join(errs...)
}

// disable issues FIFO_DISABLE_CHANNELS for d's channels (disable, or
// re-enable).
func (s *session) disable(d *devicePlan, disable bool) error {
	f, err := s.file(d.fd)
	if err != nil {
		return err
	}
	if err := f.disableChannels(d.client, d.subdevice, d.channels(), disable); err != nil {
		return fmt.Errorf("nvrm: process %d, GPU %d subdevice %#x: %w", s.pid, d.instance, d.subdevice, err)
	}
	return nil
}

// What a GPU answered to FIFO_DISABLE_CHANNELS.
const (
	answerUnknown  = iota // never asked
	answerRefused         // NOT_SUPPORTED: no GSP firmware
	answerHonoured        // took the channels off: GSP firmware
)

// disableChannelsAnswer returns what GPU instance answered to
// FIFO_DISABLE_CHANNELS last.
func (c *Controller) disableChannelsAnswer(instance uint32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok, asked := c.disableChannels[instance]
	switch {
	case !asked:
		return answerUnknown
	case ok:
		return answerHonoured
	}
	return answerRefused
}

// noteDisableChannels remembers what GPU instance answered to
// FIFO_DISABLE_CHANNELS.
func (c *Controller) noteDisableChannels(instance uint32, answer int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.disableChannels[instance] = answer == answerHonoured
}

// Resume undoes the suspension of pid's channel groups on GPU gpu as each
// group's record says (re-enabling its channels, or scheduling it again
// with GPFIFO_SCHEDULE{bEnable=1}; a group without a record is scheduled
// again) and forgets the records of the groups resumed. Every group is
// tried; the errors are joined.
func (c *Controller) Resume(pid uint32, gpu int) error {
	groups, err := c.groups(pid, gpu)
	if err != nil {
		return err
	}
	start, err := c.reg.startTime(pid)
	if err != nil {
		return err
	}
	recorded := c.reg.suspendedOf(pid)
	recs := make([]SuspendedGroup, len(groups))
	for i, g := range groups {
		r, ok := recorded[[2]uint32{g.Client, g.Handle}]
		if !ok {
			r = SuspendedGroup{PID: pid, StartTime: start, Group: g, Method: SuspendSchedule}
		}
		recs[i] = r
	}
	resumed, err := c.resume(pid, start, recs)
	if errors.Is(err, ErrProcessExited) {
		// Nothing left to resume.
		c.reg.Forget(pid)
		return errors.Join(err, c.reg.Save())
	}
	err = c.explainInvalidClient(pid, err)
	if len(resumed) > 0 {
		err = errors.Join(err, c.reg.clearSuspended(pid, resumed))
	}
	return err
}

// ResumeAll resumes every channel group the registry holds suspended: at
// start, those a previous run left behind; at a clean exit, its own. It
// works from the records alone, and returns the errors of the groups it
// could not resume; a process that exited meanwhile is not an error.
func (c *Controller) ResumeAll() error {
	byPID := map[uint32][]SuspendedGroup{}
	for _, s := range c.reg.Suspended() {
		byPID[s.PID] = append(byPID[s.PID], s)
	}
	var errs []error
	for pid, recs := range byPID {
		resumed, err := c.resume(pid, recs[0].StartTime, recs)
		switch {
		case errors.Is(err, ErrProcessExited):
			c.reg.Forget(pid)
		case err != nil:
			errs = append(errs, fmt.Errorf("resume process %d: %w", pid, c.explainInvalidClient(pid, err)))
		}
		if err := c.reg.clearSuspended(pid, resumed); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// resume undoes recs, one process's records, each as it says, going on
// past failures, and returns the groups it resumed.
func (c *Controller) resume(pid uint32, start uint64, recs []SuspendedGroup) ([]Group, error) {
	groups := make([]Group, len(recs))
	method := map[[2]uint32]SuspendedGroup{}
	for i, r := range recs {
		groups[i] = r.Group
		method[[2]uint32{r.Group.Client, r.Group.Handle}] = r
	}
	plans := planDevices(groups, func(g Group) (SuspendMethod, uint32) {
		r := method[[2]uint32{g.Client, g.Handle}]
		if r.Method == SuspendDisableChannels {
			return SuspendDisableChannels, r.Subdevice
		}
		return SuspendSchedule, 0
	})
	var resumed []Group
	finished, err := c.run(pid, start, func(s *session) error {
		var errs []error
		for i := range plans {
			d := &plans[i]
			if d.method == SuspendDisableChannels {
				err := s.disable(d, false)
				if err == nil {
					resumed = append(resumed, d.groups...)
					continue
				}
				errs = append(errs, err)
				if stopsRun(err) {
					break
				}
				continue
			}
			done, err := s.eachGroup(d.groups, func(f *rmFile, g Group) error {
				if err := f.schedule(g, true, c.opts.Layout.ScheduleSize); err != nil {
					return err
				}
				c.reg.setGroup(pid, g, func(o *object) { o.Disabled = false })
				return nil
			})
			for j, ok := range done {
				if ok {
					resumed = append(resumed, d.groups[j])
				}
			}
			if err != nil {
				errs = append(errs, err)
				if stopsRun(err) {
					break
				}
			}
		}
		return errors.Join(errs...)
	})
	if !finished {
		return nil, err
	}
	return resumed, err
}
