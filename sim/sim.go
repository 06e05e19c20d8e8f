package sim

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// Class is a process's SLO class as the simulator sees it: it decides who
// preempts whom under ModePriority and how reports group processes.
type Class uint8

// Classes.
const (
	ClassBE Class = iota // best effort
	ClassLC              // latency critical
)

// String returns "lc" or "be".
func (c Class) String() string {
	if c == ClassLC {
		return "lc"
	}
	return "be"
}

// Process describes one simulated CUDA process.
type Process struct {
	// Name identifies the process in reports (and is its comm, truncated to
	// 15 bytes, in exec events).
	Name string
	// Class is its SLO class.
	Class Class
	// GPU is the index of the GPU it runs on.
	GPU int
	// Program is its host program.
	Program Program
	// Timeslice of its channel group (0: Options.Timeslice).
	Timeslice time.Duration
	// Interleave is its channel group's interleave level at start; nil is
	// the driver's default for a new group, sched.InterleaveMedium. Equal
	// levels share equally.
	Interleave *sched.Interleave
}

// FirstPID is the pid of the first process added; later ones count up.
const FirstPID = 1000

// maxInstantOps bounds how many operations a host program may issue at one
// virtual instant, so that a program that never blocks is an error, not a
// hang.
const maxInstantOps = 1 << 20

// ErrClosed is returned by Read after Close.
var ErrClosed = fmt.Errorf("simulator: %w", trace.ErrClosed)

// Simulator is one simulated node. It is not safe for concurrent use,
// except Close, which may be called from any goroutine to stop a Run or
// Read early.
type Simulator struct {
	cfg   config
	now   uint64
	end   uint64
	q     queue
	gpus  []*gpu
	procs []*proc
	err   error

	started  bool
	finished bool
	closed   atomic.Bool // set by Close, from any goroutine

	out      []trace.Event // events produced and not yet read
	outN     []uint32      // how many times each is read: a burst's launches are one entry
	outHead  int
	deadline uint64

	timeline []Segment
	dropped  uint64

	progress func(now uint64) // called by Read every progressEvery events
	steps    uint             // events simulated by Read

	// soon is a host to wake at the end of the step (wakeSoon), with the
	// sequence number its event would have had.
	soon    *proc
	soonSeq uint64

	controls []action // enforcement actions waiting for ControlLatency
	ctlHead  int
	ctlSrc   int32 // the event source of the oldest
}

// New returns a simulator with no processes.
func New(opts *Options) (*Simulator, error) {
	cfg, err := opts.resolve()
	if err != nil {
		return nil, fmt.Errorf("simulator options: %w", err)
	}
	s := &Simulator{cfg: cfg}
	for i := 0; i < cfg.gpus; i++ {
		s.gpus = append(s.gpus, newGPU(s, i))
	}
	s.ctlSrc = s.q.add(evControl, 0)
	return s, nil
}

// Add adds a process and returns its pid. Processes are added before the
// run starts.
func (s *Simulator) Add(p Process) (uint32, error) {
	if s.started {
		return 0, errors.New("add process: simulation already started")
	}
	if p.GPU < 0 || p.GPU >= len(s.gpus) {
		return 0, fmt.Errorf("add process %q: gpu %d does not exist (%d GPUs)", p.Name, p.GPU, len(s.gpus))
	}
	if p.Program == nil {
		return 0, fmt.Errorf("add process %q: no program", p.Name)
	}
	if p.Timeslice < 0 {
		return 0, fmt.Errorf("add process %q: negative timeslice %v", p.Name, p.Timeslice)
	}
	il := sched.InterleaveMedium
	if p.Interleave != nil {
		il = *p.Interleave
	}
	if !il.Valid() {
		return 0, fmt.Errorf("add process %q: invalid interleave level %d", p.Name, il)
	}
	ts := uint64(p.Timeslice)
	if ts == 0 {
		ts = s.cfg.timeslice
	}
	pr := &proc{
		idx: len(s.procs), pid: FirstPID + uint32(len(s.procs)), name: p.Name, class: p.Class,
		gpu: p.GPU, prog: p.Program, timeslice: ts, interleave: il, copyAt: -1,
	}
	pr.src = s.q.add(evHost, int32(pr.idx))
	pr.into, _ = p.Program.(ProgramInto)
	s.procs = append(s.procs, pr)
	s.gpus[p.GPU].addProc(pr)
	return pr.pid, nil
}

// Now returns the virtual time in nanoseconds (engine.Clock).
func (s *Simulator) Now() uint64 { return s.now }

// DefaultTimeslice is the timeslice of a channel group none was set for
// (Options.Timeslice).
func (s *Simulator) DefaultTimeslice() time.Duration { return time.Duration(s.cfg.timeslice) }

// start begins the simulation: every host program starts at time 0.
func (s *Simulator) start(end uint64) {
	if s.started {
		return
	}
	s.started = true
	s.end = end
	for _, p := range s.procs {
		if s.cfg.observe {
			ev := s.emit(1)
			ev.Kind, ev.PID, ev.TID = trace.KindExec, p.pid, p.pid
			copy(ev.Proc.Comm[:15], p.name)
		}
		s.wakeAt(p, 0)
	}
}

// Run simulates until virtual time end (ns) or until ctx is cancelled or
// Close is called. Calling it again after a completed run is a no-op. It
// returns the first error of the model (a program failure or an exceeded
// bound), or ctx's error.
func (s *Simulator) Run(ctx context.Context, end uint64) error {
	return s.RunProgress(ctx, end, nil)
}

// progressEvery is how many events pass between two checks of the
// context and two progress calls: cheap enough to ignore, frequent enough
// that a caller can report about once a second whatever the simulated
// time per event.
const progressEvery = 1 << 14

// RunProgress is Run that also calls progress(now), if not nil, every
// 16,384 events.
func (s *Simulator) RunProgress(ctx context.Context, end uint64, progress func(now uint64)) error {
	s.start(end)
	for n := 0; ; n++ {
		if n&(progressEvery-1) == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("simulation stopped at %v: %w", time.Duration(s.now), err)
			}
			if s.closed.Load() {
				return ErrClosed
			}
			if progress != nil && n > 0 {
				progress(s.now)
			}
		}
		more := s.step()
		s.out, s.outN, s.outHead = s.out[:0], s.outN[:0], 0
		if s.err != nil {
			return s.err
		}
		if !more {
			return nil
		}
	}
}

// step processes the next event. It returns false when the run has ended.
func (s *Simulator) step() bool {
	if s.err != nil {
		return false
	}
	if s.q.len() == 0 || s.q.peek().t > s.end {
		s.finish()
		return false
	}
	var e event
	if s.q.small {
		e = s.q.popSorted()
	} else {
		e = s.q.pop()
	}
	src := s.q.srcs[e.src]
	id := src.id
	s.now = e.t
	switch src.kind {
	case evGPU:
		s.gpus[id].onEvent(s.now)
	case evCopy:
		s.gpus[id/2].copyDone(int(id%2), s.now)
	case evHost:
		s.wakeHost(s.procs[id], s.now)
	case evControl:
		a := s.controls[s.ctlHead]
		s.ctlHead++
		if s.ctlHead == len(s.controls) {
			s.controls, s.ctlHead = s.controls[:0], 0
		} else {
			next := &s.controls[s.ctlHead]
			s.q.set(s.ctlSrc, next.t, next.seq)
		}
		s.apply(&a)
	}
	// A host woken directly can release another (a launch under spatial
	// sharing completes others' kernels): each in turn.
	for s.soon != nil {
		s.runSoon()
	}
	return true
}

// finish settles the accounts at the end time.
func (s *Simulator) finish() {
	if s.finished {
		return
	}
	s.finished = true
	if s.now < s.end {
		s.now = s.end
	}
	for _, g := range s.gpus {
		g.settle(s.now)
	}
}

// schedule makes source i's pending event the one at t (replacing the
// one it had), failing the run past the bound on pending events.
func (s *Simulator) schedule(i int32, t uint64) {
	q := &s.q
	// room's bound, tested first without a call: the actions queued are
	// at least those pending.
	if !q.pending(i) && len(q.events)+len(s.controls)+s.soonN() >= s.cfg.maxEvents && !s.room() {
		return
	}
	e := event{t: t, seq: q.next(), src: i}
	if q.small {
		q.setSorted(e)
		return
	}
	q.setHeap(e)
}

// soonN counts the host wake left for the end of the step (wakeSoon), an
// event pending as far as the bound goes.
func (s *Simulator) soonN() int {
	if s.soon != nil {
		return 1
	}
	return 0
}

// room reports whether one more event may be pending, failing the run if
// not. Events pending are one per source at most, plus the enforcement
// actions waiting behind the oldest.
func (s *Simulator) room() bool {
	n := s.q.len() + s.soonN()
	if len(s.controls) > s.ctlHead {
		n += len(s.controls) - s.ctlHead - 1
	}
	if n >= s.cfg.maxEvents {
		s.fail(fmt.Errorf("event queue bound %d reached at %v: the workload is too large for the configured memory bound (raise max events)",
			s.cfg.maxEvents, time.Duration(s.now)))
		return false
	}
	return true
}

// fail records the run's first error; the run stops at the next step.
func (s *Simulator) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}

// Err returns the error that stopped the run, if any.
func (s *Simulator) Err() error { return s.err }
