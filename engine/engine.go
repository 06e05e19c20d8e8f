package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// Defaults of Options.
const (
	DefaultControlInterval = 100 * time.Millisecond
	DefaultRequestTimeout  = time.Second
	DefaultQuotaPeriod     = 100 * time.Millisecond
	DefaultFeedbackMin     = 20
	DefaultDecisions       = 256
	// DefaultTimeslice is NVIDIA's default channel-group timeslice.
	DefaultTimeslice = 1024 * time.Microsecond
)

// Options configures an Engine. The zero value is usable.
type Options struct {
	// Classifier plans new processes; nil plans every process at
	// LevelObserve in class "unclassified".
	Classifier Classifier
	// Victims is the policy's control-loop entry point; nil uses the
	// default choice (see VictimChooser).
	Victims VictimChooser
	// Placement says which GPUs a process uses; nil: GPU 0.
	Placement Placement
	// IdleGap ends a latency-critical request: after its last
	// synchronizing call returns, a process this long without a driver
	// call is idle. Zero: idle as soon as a synchronization returns.
	IdleGap time.Duration
	// RequestTimeout ends a request whose latest call was a launch or
	// copy once this long has passed after the request's latest end (see
	// trace.RequestTracker), so that a process that never synchronizes
	// cannot hold best-effort work off a GPU for ever. Zero:
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// ControlInterval is the control loop's period (victims, SLO feedback,
	// quotas' accounting, the snapshot). Zero: DefaultControlInterval.
	ControlInterval time.Duration
	// Feedback enables SLO feedback: a latency-critical class starts
	// escalated (its requests suspend best-effort work), relaxes to
	// timeslices alone when its attainment is comfortably above target
	// (misses under half its error budget), and escalates again when
	// attainment falls below target. FeedbackMin requests must be in the
	// window before it acts (zero: DefaultFeedbackMin), and FeedbackHold
	// must pass between changes (zero: a quarter of the class's window).
	Feedback     bool
	FeedbackMin  int
	FeedbackHold time.Duration
	// MinHarvestGap, when set, is the shortest idle gap worth resuming
	// best-effort work into: a latency-critical process whose learned
	// inter-request gap is shorter keeps its victims suspended across the
	// gap (two switches would cost more than the gap yields).
	MinHarvestGap time.Duration
	// QuotaPeriod is the duty cycle of a class with a GPU-share quota.
	// Zero: DefaultQuotaPeriod.
	QuotaPeriod time.Duration
	// Decisions is how many recent decisions, and how many recent
	// preemptions, the snapshot keeps (zero: DefaultDecisions each).
	Decisions int
	// Observers see every event the engine applies, in order, on the
	// engine's goroutine; they must not block. Those that are also
	// Tickers hear every control tick.
	Observers []Observer
	// Name names a process the trace saw no exec of (it was running
	// before tracing began), for the table and the classifier; nil or
	// "" leaves it unnamed.
	Name func(pid uint32) string
	// DefaultTimeslice is the driver's default channel-group timeslice.
	// A process that is not latency-critical and whose plan asks for a
	// shorter one gets it only while a latency-critical process shares
	// the GPU: alone, or among other best-effort work, it keeps (or gets
	// back) this one, since best-effort processes given a short slice
	// switch each other off the GPU every slice, and spend much of it
	// saving and loading their contexts. Zero: DefaultTimeslice.
	DefaultTimeslice time.Duration
}

// Observer sees the events the engine applies.
type Observer interface {
	Event(ev *trace.Event)
}

// Ticker is an Observer that also hears the control loop: Tick runs at
// every control tick (Options.ControlInterval) with the engine's clock,
// whether an event or a read deadline moved it there, on the engine's
// goroutine. It is how a subscriber does timed work on the engine's clock
// with no goroutine of its own (the trace command releases the events it
// holds for ordering when none arrive).
type Ticker interface {
	Observer
	Tick(now uint64)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ev *trace.Event)

// Event calls f.
func (f ObserverFunc) Event(ev *trace.Event) { f(ev) }

// Stats counts what the engine did.
type Stats struct {
	Events, Processes, Classifications, ClassifyErrors uint64
	Requests, Suspends, Resumes, Gates, Ungates        uint64
	Timeslices, Interleaves, EnforceErrors             uint64
	VictimCalls, VictimErrors, Escalations, Relaxes    uint64
	HarvestsSkipped                                    uint64
	// Arms counts changes to the gates armed for latency-critical
	// processes' requests (Armer).
	Arms uint64
}

// Engine is the one event loop: it applies a source's events to the
// process table, tracks requests and SLOs, and plans and enforces
// preemption. Run owns it; other goroutines read its Snapshot and Post
// work to it.
type Engine struct {
	src  Source
	dl   DeadlineSource // src, if it has deadlines
	enf  Enforcer
	sup  Support
	opts Options
	// tickers are the observers that hear control ticks.
	tickers []Ticker
	now     uint64
	procs   map[uint32]*proc
	execs   map[uint32]string // names from exec events, until a first driver call
	last    *proc
	gpus    map[int]*gpuState
	// slicesLater holds back setting timeslices while every process is
	// reclassified; slicesDue are the GPUs to settle then.
	slicesLater bool
	slicesDue   map[int]bool
	cls         map[string]*class
	// idle keeps the latency measured for classes that lost their last
	// member, so that a class's counts and distribution go on over the
	// daemon's life when a member comes again (at most idleClasses); its
	// SLO window, which feedback acts on, starts again empty.
	idle    map[string]latency
	idleSeq []string // idle's names, oldest first
	tm      timers
	// victimSet is the chooser's cached answer: pid -> GPUs (empty: all
	// of its GPUs); nil: the default choice.
	victimSet   map[uint32][]int
	throttles   map[uint32]*cycle
	nextControl uint64
	deadline    uint64
	decisions   ring
	preemptions ring
	st          Stats
	snap        atomic.Pointer[Snapshot]
	// posted work, from other goroutines; npost counts it for the fast
	// path's check.
	mu     sync.Mutex
	posted []posted
	npost  atomic.Int32

	// victimsStale: a classification since the chooser last answered may
	// change its answer; the next preemption asks it first.
	victimsStale bool
	// armStale: plans, victims or escalation changed since the gates were
	// last armed (Armer); armed counts the processes with armed gates,
	// settlePending says a disarmed one may have left gates to open.
	armStale, settlePending bool
	armed                   int
	// arriving is the event whose time the clock is moving to, while the
	// timers it makes due fire (see nextRequestHolds).
	arriving *trace.Event
}

type posted struct {
	at uint64
	fn func(*Engine)
}

// New returns an engine reading src and enforcing on enf; with a nil enf
// it only observes, and plans every process at the observe level whatever
// its classifier says. Timers (request ends, resumes, quotas, the control
// loop) need a DeadlineSource; with a plain Source they fire as events pass
// their time.
func New(src Source, enf Enforcer, opts *Options) (*Engine, error) {
	if src == nil {
		return nil, errors.New("engine: no event source")
	}
	e := &Engine{src: src, enf: enf, procs: map[uint32]*proc{}, execs: map[uint32]string{}, gpus: map[int]*gpuState{}, cls: map[string]*class{}, idle: map[string]latency{}}
	if opts != nil {
		e.opts = *opts
	}
	o := &e.opts
	if o.IdleGap < 0 || o.ControlInterval < 0 || o.QuotaPeriod < 0 || o.RequestTimeout < 0 || o.MinHarvestGap < 0 || o.FeedbackHold < 0 || o.FeedbackMin < 0 || o.DefaultTimeslice < 0 {
		return nil, errors.New("engine: negative idle gap, interval, period, timeslice or feedback setting")
	}
	if o.DefaultTimeslice == 0 {
		o.DefaultTimeslice = DefaultTimeslice
	}
	if o.ControlInterval == 0 {
		o.ControlInterval = DefaultControlInterval
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.QuotaPeriod == 0 {
		o.QuotaPeriod = DefaultQuotaPeriod
	}
	if o.FeedbackMin == 0 {
		o.FeedbackMin = DefaultFeedbackMin
	}
	if o.Decisions == 0 {
		o.Decisions = DefaultDecisions
	}
	if o.Classifier == nil {
		o.Classifier = ClassifierFunc(func(ProcessInfo) (sched.Plan, string, error) {
			return sched.Plan{Class: "unclassified", MaxGPUShare: 1, Interleave: sched.InterleaveMedium}, "no classifier", nil
		})
	}
	if d, ok := src.(DeadlineSource); ok {
		e.dl = d
	}
	if s, ok := enf.(Support); ok {
		e.sup = s
	}
	for _, ob := range o.Observers {
		if t, ok := ob.(Ticker); ok {
			e.tickers = append(e.tickers, t)
		}
	}
	e.decisions.buf = make([]Decision, 0, o.Decisions)
	e.preemptions.buf = make([]Decision, 0, o.Decisions)
	e.publish()
	return e, nil
}

// Stats returns the engine's counters; call it from Run's goroutine or
// after Run returned (the snapshot carries a copy for everyone else).
func (e *Engine) Stats() Stats { return e.st }

// Post runs fn on the engine's goroutine at the next event or deadline;
// it is how other goroutines change engine state (a policy reload).
func (e *Engine) Post(fn func(*Engine)) { e.PostAt(0, fn) }

// PostAt runs fn on the engine's goroutine once its clock reaches at
// (source time): deterministic in the simulator.
func (e *Engine) PostAt(at uint64, fn func(*Engine)) {
	e.mu.Lock()
	e.posted = append(e.posted, posted{at: at, fn: fn})
	e.npost.Add(1)
	e.mu.Unlock()
	if w, ok := e.src.(interface{ Wake() }); ok && at == 0 {
		w.Wake()
	}
}

// Run applies the source's events until it ends (nil at io.EOF), ctx is
// done, or the source fails. Whatever way it returns, it first undoes
// every enforcement it applied: no process stays suspended or gated.
func (e *Engine) Run(ctx context.Context) (err error) {
	defer func() {
		if rerr := e.ReleaseAll(); rerr != nil && err == nil {
			err = rerr
		}
		e.publish()
	}()
	// Cancellation wakes a source that can be woken, so that the
	// enforcer is still open for ReleaseAll; others are closed.
	cancel := func() { e.src.Close() }
	if w, ok := e.src.(interface{ Wake() }); ok {
		cancel = w.Wake
	}
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	var ev trace.Event
	for n := 0; ; n++ {
		rerr := e.src.Read(&ev)
		switch {
		case rerr == nil:
			e.Apply(&ev)
			if n%1024 == 0 && ctx.Err() != nil {
				return nil
			}
		case errors.Is(rerr, trace.ErrDeadline):
			if ctx.Err() != nil {
				return nil
			}
			e.advance(e.dl.Now())
			e.maybeControl()
		case errors.Is(rerr, io.EOF):
			return nil
		case errors.Is(rerr, trace.ErrClosed) && ctx.Err() != nil:
			return nil
		default:
			return fmt.Errorf("engine: read events: %w", rerr)
		}
		if err := e.armDeadline(); err != nil {
			return err
		}
	}
}

// Drain applies, after Run returned and the source was closed, the
// events the source still returns (a closed reader hands back what it had
// read ahead, then an error), so that a trace stopped by Ctrl-C or its
// duration counts them too. As Run does, it then undoes whatever they
// led to and publishes the snapshot, which counts them: Apply alone
// leaves the snapshot to the next control period.
func (e *Engine) Drain() error {
	var ev trace.Event
	for e.src.Read(&ev) == nil {
		e.Apply(&ev)
	}
	err := e.ReleaseAll()
	e.publish()
	return err
}

// Apply applies one event: the fast path. Run calls it; benchmarks and
// tests may call it directly on the goroutine that owns the engine.
func (e *Engine) Apply(ev *trace.Event) {
	e.st.Events++
	if ev.Time > e.now {
		e.arriving = ev
		e.advance(ev.Time)
		e.arriving = nil
	}
	for _, o := range e.opts.Observers {
		o.Event(ev)
	}
	switch ev.Kind {
	case trace.KindExec:
		e.exec(ev)
	case trace.KindExit:
		e.exit(ev.PID)
	case trace.KindLaunch, trace.KindCopy, trace.KindSync:
		p := e.lookup(ev)
		if p.plan.LatencyCritical {
			e.lcCall(p, ev)
		}
	}
	// The control loop runs after the event: a preemption the event calls
	// for does not wait for it.
	e.maybeControl()
}

// maybeControl runs the control loop when its period has passed, and
// otherwise rearms gates whose victims changed (see Armer).
func (e *Engine) maybeControl() {
	if e.now >= e.nextControl {
		e.control()
		e.nextControl = e.now + uint64(e.opts.ControlInterval)
	} else if e.armStale {
		e.arm()
	}
}

// advance moves the clock to now, running the posted work and timers that
// are due (the control loop runs after the event that moved the clock).
func (e *Engine) advance(now uint64) {
	if now > e.now {
		e.now = now
	}
	if e.npost.Load() > 0 {
		e.runPosted()
	}
	for {
		t, ok := e.tm.due(e.now)
		if !ok {
			break
		}
		e.fire(t)
	}
}

func (e *Engine) runPosted() {
	e.mu.Lock()
	var due []posted
	keep := e.posted[:0]
	for _, p := range e.posted {
		if p.at <= e.now {
			due = append(due, p)
		} else {
			keep = append(keep, p)
		}
	}
	e.posted = keep
	e.npost.Store(int32(len(keep)))
	e.mu.Unlock()
	for _, p := range due {
		p.fn(e)
	}
}

// armDeadline sets the source's read deadline to the next timer.
func (e *Engine) armDeadline() error {
	if e.dl == nil {
		return nil
	}
	next := e.nextControl
	if t, ok := e.tm.next(); ok && t < next {
		next = t
	}
	e.mu.Lock()
	for _, p := range e.posted {
		if p.at < next {
			next = max(p.at, e.now)
		}
	}
	e.mu.Unlock()
	if next == e.deadline {
		return nil
	}
	e.deadline = next
	if err := e.dl.SetReadDeadline(next); err != nil {
		return fmt.Errorf("engine: set read deadline: %w", err)
	}
	return nil
}

// ReleaseAll undoes every suspension, gate and quota the engine applied,
// going on past errors and returning them joined: armed gates are
// disarmed first, so that no request closes one again, and whatever they
// closed is opened last. The timeslices it set go back to the driver's
// default too, as far as they can (a process may have gone meanwhile: a
// failure is recorded, not returned). Run calls it on return.
func (e *Engine) ReleaseAll() error {
	e.disarmAll()
	var errs []error
	for _, pid := range e.pids() {
		errs = append(errs, e.releaseProc(e.procs[pid], "engine stopping"))
	}
	e.settle(true)
	for _, pid := range e.pids() {
		e.unsetSlices(e.procs[pid], "engine stopping")
	}
	return errors.Join(errs...)
}
