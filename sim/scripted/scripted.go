// Package scripted is a fixed, hand-written scheduling policy that drives
// an engine.Enforcer from the events of an engine.Source. It stands in for
// the real engine in the simulator's closed-loop tests and what-if runs:
// it uses nothing but the engine's interfaces (events, clock, read
// deadlines, enforcement), so whatever it can do against the simulator the
// engine can do too.
package scripted

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// Policy is the scripted rule.
type Policy uint8

// Policies.
const (
	// SuspendBE suspends every BE process on a GPU while any LC process on
	// it is active (from its first driver call until IdleGap after its last
	// synchronization returned) and resumes them when all are idle.
	SuspendBE Policy = iota + 1
	// SplitTimeslice sets, once per process, BE timeslices to BETimeslice
	// and LC timeslices to LCTimeslice with interleave level high.
	SplitTimeslice
)

// String names the policy.
func (p Policy) String() string {
	switch p {
	case SuspendBE:
		return "suspend-be"
	case SplitTimeslice:
		return "split-timeslice"
	}
	return fmt.Sprintf("policy(%d)", uint8(p))
}

// Process tells the controller a process's class and GPU (the real engine
// learns these from policy and the node inventory).
type Process struct {
	PID uint32
	LC  bool
	GPU int
}

// Options configures a Controller; nil means defaults.
type Options struct {
	Policy Policy // default SuspendBE
	// IdleGap: an LC process this long without a driver call after its
	// last synchronization is idle (SuspendBE; default 0: idle as soon as
	// a synchronization returns with nothing queued after it).
	IdleGap time.Duration
	// BETimeslice and LCTimeslice for SplitTimeslice (defaults 100 µs and
	// 16 ms).
	BETimeslice time.Duration
	LCTimeslice time.Duration
}

// Stats counts what the controller did.
type Stats struct {
	Events, Suspends, Resumes, Timeslices, Interleaves uint64
}

// Controller applies a Policy.
type Controller struct {
	src   engine.DeadlineSource
	enf   engine.Enforcer
	opts  Options
	procs map[uint32]*state
	last  *state     // the process of the previous event (events come in runs)
	be    [][]*state // BE processes per GPU index, by ascending pid
	busy  []int      // active LC processes per GPU index
	idle  idleQueue  // pending idle times of active LC processes
	// deadline is the read deadline last set (0: none); changed says
	// idle times may have changed since.
	deadline uint64
	changed  bool
	st       Stats
}

type state struct {
	Process
	// req follows an LC process's requests; active is set from a
	// request's first launch or copy until it ends: while it is, the
	// process holds its GPU's BE processes suspended.
	req       trace.RequestTracker
	active    bool
	suspended bool
	set       bool
}

// New returns a controller for the given processes.
func New(src engine.DeadlineSource, enf engine.Enforcer, procs []Process, opts *Options) (*Controller, error) {
	c := &Controller{src: src, enf: enf, procs: map[uint32]*state{}}
	if opts != nil {
		c.opts = *opts
	}
	if c.opts.Policy == 0 {
		c.opts.Policy = SuspendBE
	}
	if c.opts.Policy > SplitTimeslice {
		return nil, fmt.Errorf("scripted controller: unknown policy %d", c.opts.Policy)
	}
	if c.opts.BETimeslice == 0 {
		c.opts.BETimeslice = 100 * time.Microsecond
	}
	if c.opts.LCTimeslice == 0 {
		c.opts.LCTimeslice = 16 * time.Millisecond
	}
	if c.opts.IdleGap < 0 || c.opts.BETimeslice < time.Microsecond || c.opts.LCTimeslice < time.Microsecond {
		return nil, errors.New("scripted controller: negative idle gap or timeslice under 1µs")
	}
	for _, p := range procs {
		if _, dup := c.procs[p.PID]; dup {
			return nil, fmt.Errorf("scripted controller: pid %d given twice", p.PID)
		}
		if p.GPU < 0 {
			return nil, fmt.Errorf("scripted controller: pid %d on gpu %d: GPU indices start at 0", p.PID, p.GPU)
		}
		// Only a synchronization's return starts an idle gap: no timeout.
		st := &state{Process: p, req: trace.NewRequestTracker(c.opts.IdleGap, 0)}
		c.procs[p.PID] = st
		for len(c.be) <= p.GPU {
			c.be, c.busy = append(c.be, nil), append(c.busy, 0)
		}
		if !p.LC {
			c.be[p.GPU] = append(c.be[p.GPU], st)
		}
	}
	for _, be := range c.be {
		slices.SortFunc(be, func(a, b *state) int { return cmp.Compare(a.PID, b.PID) })
	}
	return c, nil
}

// Stats returns what the controller has done so far.
func (c *Controller) Stats() Stats { return c.st }

// batchSource is a source that lends its events in place (sim.Simulator),
// each standing for a run of identical ones: the controller reads the
// simulator's some 100 million launches a simulated hour without copying
// them.
type batchSource interface {
	ReadBatch() (evs []trace.Event, counts []uint32, err error)
}

// Run reads events until the source ends (nil) or fails.
func (c *Controller) Run() error {
	b, _ := c.src.(batchSource)
	var ev trace.Event
	for {
		var err error
		if b != nil {
			var evs []trace.Event
			var counts []uint32
			if evs, counts, err = b.ReadBatch(); err == nil {
				for i := range evs {
					// The copies after the first of a run of identical
					// events change nothing: a launch or copy only
					// opens or extends a request.
					c.st.Events += uint64(counts[i])
					if err := c.handle(&evs[i]); err != nil {
						return err
					}
					if err := c.setDeadline(); err != nil {
						return err
					}
				}
				continue
			}
		} else if err = c.src.Read(&ev); err == nil {
			c.st.Events++
			if err := c.handle(&ev); err != nil {
				return err
			}
			if err := c.setDeadline(); err != nil {
				return err
			}
			continue
		}
		switch {
		case errors.Is(err, trace.ErrDeadline):
			c.changed = true
			if err := c.expire(c.src.Now()); err != nil {
				return err
			}
			if err := c.setDeadline(); err != nil {
				return err
			}
		case errors.Is(err, io.EOF):
			return nil
		default:
			return err
		}
	}
}

// setDeadline sets the source's read deadline to the earliest pending
// idle time if that changed. Only LC processes' events and expiries
// change idle times: after any other event the queue is left alone.
func (c *Controller) setDeadline() error {
	if !c.changed {
		return nil
	}
	c.changed = false
	if t := c.idle.next(); t != c.deadline {
		c.deadline = t
		if err := c.src.SetReadDeadline(t); err != nil {
			return err
		}
	}
	return nil
}

// lookup finds an event's process; nil for processes not under control.
func (c *Controller) lookup(pid uint32) *state {
	if c.last != nil && c.last.PID == pid {
		return c.last
	}
	p := c.procs[pid]
	if p != nil {
		c.last = p
	}
	return p
}

func (c *Controller) handle(ev *trace.Event) error {
	p := c.lookup(ev.PID)
	if p == nil {
		return nil
	}
	if c.opts.Policy == SplitTimeslice {
		return c.split(p)
	}
	if !p.LC {
		return nil
	}
	c.changed = true
	p.req.Call(ev)
	switch ev.Kind {
	case trace.KindLaunch, trace.KindCopy:
		// The request's idle time, if one was pending, is cancelled: its
		// queue entry is stale now.
		if !p.active {
			p.active = true
			c.busy[p.GPU]++
			if c.busy[p.GPU] == 1 {
				return c.suspendBE(p.GPU)
			}
		}
	case trace.KindSync:
		if at, ok := p.req.Deadline(); ok {
			c.idle.push(at, p)
			if p.active && c.opts.IdleGap == 0 {
				return c.expire(at)
			}
		}
	}
	return nil
}

// split applies SplitTimeslice to a process the first time it is seen.
func (c *Controller) split(p *state) error {
	if p.set {
		return nil
	}
	p.set = true
	ts := c.opts.BETimeslice
	if p.LC {
		ts = c.opts.LCTimeslice
		c.st.Interleaves++
		if err := c.enf.SetInterleave(p.PID, sched.InterleaveHigh); err != nil {
			return err
		}
	}
	c.st.Timeslices++
	return c.enf.SetTimeslice(p.PID, p.GPU, uint64(ts/time.Microsecond))
}

// expire ends the requests of LC processes whose gap has passed at now,
// in order of their idle times (then pids), and resumes BE on GPUs left
// with no active LC.
func (c *Controller) expire(now uint64) error {
	for {
		p := c.idle.due(now)
		if p == nil {
			return nil
		}
		p.req.End()
		if !p.active {
			continue // a request of synchronizations alone held nothing
		}
		p.active = false
		c.busy[p.GPU]--
		if c.busy[p.GPU] == 0 {
			if err := c.resumeBE(p.GPU); err != nil {
				return err
			}
		}
	}
}

func (c *Controller) suspendBE(gpu int) error {
	for _, p := range c.be[gpu] {
		if err := c.enf.Suspend(p.PID, gpu); err != nil {
			return fmt.Errorf("suspend pid %d: %w", p.PID, err)
		}
		p.suspended = true
		c.st.Suspends++
	}
	return nil
}

func (c *Controller) resumeBE(gpu int) error {
	for _, p := range c.be[gpu] {
		if err := c.enf.Resume(p.PID, gpu); err != nil {
			return fmt.Errorf("resume pid %d: %w", p.PID, err)
		}
		p.suspended = false
		c.st.Resumes++
	}
	return nil
}
