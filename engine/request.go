package engine

import (
	"math"
	"slices"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// request tracks a latency-critical process's requests (ARCHITECTURE.md,
// "Requests and SLOs"): the busy periods trace.RequestTracker finds in its
// calls and what they add up to (whether the planner held the open one's
// victims is proc.preempted).
type request struct {
	busy trace.RequestTracker
	// idleAt is when the process's earliest pending idle timer fires, 0
	// when none is pending. A call moves the deadline later and arms
	// nothing: the pending timer, when it fires, arms one at the
	// deadline then (a latency-critical process makes thousands of calls
	// a second, and a timer for each filled the heap with stale ones).
	idleAt uint64
	// lastEnd is when the previous request ended; the predictor learns the
	// idle gaps and durations (exponentially weighted, α = 1/8).
	lastEnd  uint64
	gap, dur float64
	samples  int
	stats    latency
}

// latency is a latency distribution and SLO window.
type latency struct {
	hist   *hdrhistogram.Histogram // microseconds; allocated at the first request
	total  uint64
	within uint64 // requests within the SLO target, over all time
	win    window
	// sum is the distribution's p50, p99 and maximum as of sumAt
	// requests: the histogram answers each by walking its buckets, and a
	// snapshot, every control tick, asks of every process and class
	// whether or not a request ended since.
	sum   [3]uint64
	sumAt uint64
}

// Histogram bounds: 1 µs to one hour, 2 significant digits (about 25 KiB
// per histogram).
const (
	histMinUS  = 1
	histMaxUS  = 3_600_000_000
	histDigits = 2
)

func (l *latency) add(t, ns uint64, met, hasSLO bool, span uint64) {
	if l.hist == nil {
		l.hist = hdrhistogram.New(histMinUS, histMaxUS, histDigits)
	}
	us := int64(max(ns/1000, histMinUS))
	_ = l.hist.RecordValue(min(us, histMaxUS))
	l.total++
	if hasSLO {
		if met {
			l.within++
		}
		l.win.add(t, met, span)
	}
}

// summary returns the p50, p99 and maximum in ns, 0 without requests.
func (l *latency) summary() (p50, p99, maxNS uint64) {
	if l.hist == nil || l.total == 0 {
		return 0, 0, 0
	}
	if l.sumAt != l.total {
		l.sum = [3]uint64{uint64(l.hist.ValueAtQuantile(50)) * 1000, uint64(l.hist.ValueAtQuantile(99)) * 1000, uint64(l.hist.Max()) * 1000}
		l.sumAt = l.total
	}
	return l.sum[0], l.sum[1], l.sum[2]
}

// window counts requests and those within target over a sliding window,
// in windowBuckets buckets: O(1) per request, a fixed 20 buckets of
// memory, and a window that slides by 1/20 of its span.
type window struct {
	span    uint64
	buckets [windowBuckets]bucket
}

const windowBuckets = 20

type bucket struct {
	slot      uint64 // t / (span/windowBuckets), +1 so that 0 is empty
	n, within uint64
}

func (w *window) add(t uint64, met bool, span uint64) {
	if span == 0 {
		return
	}
	w.span = span
	width := max(span/windowBuckets, 1)
	slot := t/width + 1
	b := &w.buckets[slot%windowBuckets]
	if b.slot != slot {
		*b = bucket{slot: slot}
	}
	b.n++
	if met {
		b.within++
	}
}

// get returns the requests and those within target in (now-span, now].
func (w *window) get(now uint64) (n, within uint64) {
	if w.span == 0 {
		return 0, 0
	}
	width := max(w.span/windowBuckets, 1)
	cur := now/width + 1
	for _, b := range w.buckets {
		if b.slot != 0 && b.slot <= cur && cur-b.slot < windowBuckets {
			n += b.n
			within += b.within
		}
	}
	return n, within
}

// attainment returns within/n, or -1 without requests.
func attainment(n, within uint64) float64 {
	if n == 0 {
		return -1
	}
	return float64(within) / float64(n)
}

// lcCall applies a latency-critical process's driver call: it opens a
// request after an idle gap, preempts the GPUs' victims at the request's
// first call (with the pre-preemption hint) or its first launch, and ends
// the request when the process goes idle.
func (e *Engine) lcCall(p *proc, ev *trace.Event) {
	r := &p.req
	if r.busy.Call(ev) {
		p.preempted = false
		if r.lastEnd != 0 && ev.Time > r.lastEnd {
			r.learn(&r.gap, float64(ev.Time-r.lastEnd))
		}
		e.st.Requests++
		for _, g := range p.gpus {
			gs := e.gpu(g)
			gs.active[p] = struct{}{}
			gs.harvestGen++ // a pending harvest decision is moot
		}
	}
	if !p.preempted && (p.plan.PrePreemptionHint || ev.Kind == trace.KindLaunch) && e.escalated(p) {
		p.preempted = true
		for _, g := range p.gpus {
			e.preemptGPU(g, p)
		}
	}
	// Only a synchronization's return can start the idle gap: while a
	// process waits in one, it makes no call the tracer reports (calls are
	// reported at their return), and it is not idle. A process that never
	// synchronizes is taken idle after RequestTimeout (the tracker's
	// deadline after a launch or copy).
	if ev.Kind == trace.KindSync && e.opts.IdleGap == 0 {
		e.finish(p)
		return
	}
	if at, ok := r.busy.Deadline(); ok && (r.idleAt == 0 || at < r.idleAt) {
		e.armIdle(p, at)
	}
}

// armIdle arms p's idle timer at at.
func (e *Engine) armIdle(p *proc, at uint64) {
	p.req.idleAt = at
	e.tm.push(timer{at: at, kind: timerIdle, p: p})
}

// idleDue handles p's idle timer due at at: it ends p's request if the
// request's deadline has come, arms the timer again at the deadline if a
// call moved it later, and does nothing for a timer an earlier one
// superseded, a request already ended or a process forgotten.
func (e *Engine) idleDue(p *proc, at uint64) {
	r := &p.req
	if at != r.idleAt {
		return
	}
	r.idleAt = 0
	if e.procs[p.key.PID] != p {
		return
	}
	switch d, ok := r.busy.Deadline(); {
	case !ok:
	case d > e.now:
		e.armIdle(p, d)
	default:
		e.finish(p)
	}
}

// learn folds x into an exponentially weighted mean.
func (r *request) learn(m *float64, x float64) {
	if r.samples == 0 || *m == 0 {
		*m = x
	} else {
		*m += (x - *m) / 8
	}
	if m == &r.gap {
		r.samples++
	}
}

// finish ends p's request: its latency goes into the process's and the
// class's distributions and SLO windows, and GPUs left with no active
// latency-critical request release their victims (unless the predictor
// says the coming gap is too short to be worth it).
func (e *Engine) finish(p *proc) {
	r := &p.req
	if !r.busy.Active() {
		return
	}
	req := r.busy.End()
	lat := req.Latency()
	r.learn(&r.dur, float64(lat))
	r.lastEnd = req.End
	met := p.plan.HasSLO && lat <= uint64(p.plan.LatencyTarget)
	r.stats.add(e.now, lat, met, p.plan.HasSLO, uint64(p.plan.Window))
	if c := p.cls; c != nil {
		cm := c.plan.HasSLO && lat <= uint64(c.plan.LatencyTarget)
		c.stats.add(e.now, lat, cm, c.plan.HasSLO, uint64(c.plan.Window))
	}
	for _, g := range p.gpus {
		gs := e.gpu(g)
		delete(gs.active, p)
		if len(gs.active) > 0 || !gs.preempted {
			continue
		}
		if e.nextRequestHolds(g) {
			continue
		}
		if wait, ok := e.shortGap(p); ok {
			e.st.HarvestsSkipped++
			gs.harvestGen++
			e.tm.push(timer{at: e.now + wait, kind: timerHarvest, gpu: g, gen: gs.harvestGen})
			e.record(Decision{PID: p.key.PID, Comm: p.comm, Class: p.plan.Class, GPU: g, Action: ActionHold,
				Reason: "predicted idle gap too short to harvest; victims stay off until the next request or the gap has passed"})
			continue
		}
		e.releaseGPU(g)
	}
	if len(p.armed) > 0 {
		e.settle(false)
	}
}

// nextRequestHolds reports whether the event the clock is moving to, the
// one that made a request's end (or a harvest) due, is a latency-critical
// call on gpu g that preempts for a request of its own: then the victims
// stay held into that request instead of being let go and held again. A
// live source delivers a request's end late, after the calls that follow
// it: letting the victims go would let a best-effort process launch once
// more beside the new request, and open a gate that an armed request had
// already closed for it (see Armer). Timers that fire at their own time
// (a source with deadlines, the simulator) have no such event.
func (e *Engine) nextRequestHolds(g int) bool {
	ev := e.arriving
	if ev == nil || (ev.Kind != trace.KindLaunch && ev.Kind != trace.KindCopy) {
		return false
	}
	q := e.procs[ev.PID]
	if q == nil || !q.plan.LatencyCritical || !slices.Contains(q.gpus, g) {
		return false
	}
	if !(q.plan.PrePreemptionHint || ev.Kind == trace.KindLaunch) || !e.escalated(q) {
		return false
	}
	e.record(Decision{PID: q.key.PID, Comm: q.comm, Class: q.plan.Class, GPU: g, Action: ActionHold,
		Reason: "the next latency-critical request had begun when the last one's end was seen: victims stay held"})
	return true
}

// shortGap reports whether p's learned idle gap is shorter than the
// shortest worth harvesting, and how long to keep the victims held if no
// request comes: twice the predicted gap.
func (e *Engine) shortGap(p *proc) (uint64, bool) {
	r := &p.req
	if e.opts.MinHarvestGap == 0 || r.samples < 4 || r.gap >= float64(e.opts.MinHarvestGap) {
		return 0, false
	}
	return uint64(math.Max(2*r.gap, 1)), true
}

// class is one SLO class: its members' strictest objective, its latency
// distribution and window, its feedback and quota state.
type class struct {
	name    string
	members int
	plan    sched.Plan
	stats   latency
	// escalated: its requests suspend best-effort work (see
	// Options.Feedback); changed is when that last changed.
	escalated bool
	changed   uint64
	quota     *cycle
}

// class returns the class named by plan, creating it.
func (e *Engine) class(plan sched.Plan) *class {
	c := e.cls[plan.Class]
	if c == nil {
		c = &class{name: plan.Class, plan: plan, escalated: true, changed: e.now}
		if st, ok := e.idle[plan.Class]; ok {
			c.stats = st
			c.stats.win = window{}
			delete(e.idle, plan.Class)
			e.idleSeq = slices.DeleteFunc(e.idleSeq, func(n string) bool { return n == plan.Class })
		}
		e.cls[plan.Class] = c
	}
	return c
}

// idleClasses bounds the classes without members whose latency the
// engine keeps (a histogram is about 25 KiB).
const idleClasses = 64

// retire keeps the latency of c, which lost its last member.
func (e *Engine) retire(c *class) {
	if c.stats.total == 0 {
		return
	}
	if len(e.idleSeq) == idleClasses {
		delete(e.idle, e.idleSeq[0])
		e.idleSeq = e.idleSeq[1:]
	}
	e.idle[c.name] = c.stats
	e.idleSeq = append(e.idleSeq, c.name)
}

// setClass moves p into c (nil: out of every class), and gives the
// classes it left and joined the plans their members make (mergePlans).
func (e *Engine) setClass(p *proc, c *class) {
	old := p.cls
	if old != nil && old != c {
		old.members--
		if old.members == 0 {
			if old.quota != nil {
				old.quota.gen++
			}
			e.retire(old)
			delete(e.cls, old.name)
		}
	}
	if c != nil && old != c {
		c.members++
	}
	p.cls = c
	// The classes' plans follow their members' as they are now: a reload
	// that loosens or tightens an objective changes the class's at once,
	// and one member leaving takes its objective with it.
	if old != nil && old != c && old.members > 0 {
		e.mergePlans(old)
	}
	if c != nil {
		e.mergePlans(c)
	}
	e.quotaFor(c)
}

// mergePlans sets c's plan from its members' (in pid order, the first's
// fields where they are not merged): the strictest objective (the
// shortest latency target, the highest percentile, the longest window),
// latency-critical if any member is, the highest priority, the smallest
// GPU share.
func (e *Engine) mergePlans(c *class) {
	var base *proc
	for _, q := range e.procs {
		if q.cls == c && (base == nil || q.key.PID < base.key.PID) {
			base = q
		}
	}
	if base == nil {
		return
	}
	c.plan = base.given
	for _, q := range e.procs {
		pp := q.given
		if q.cls != c || q == base {
			continue
		}
		if pp.HasSLO && (!c.plan.HasSLO || pp.LatencyTarget < c.plan.LatencyTarget) {
			c.plan.LatencyTarget = pp.LatencyTarget
		}
		if pp.HasSLO {
			c.plan.HasSLO = true
			c.plan.Percentile = math.Max(c.plan.Percentile, pp.Percentile)
			c.plan.Window = max(c.plan.Window, pp.Window)
		}
		c.plan.LatencyCritical = c.plan.LatencyCritical || pp.LatencyCritical
		c.plan.Priority = max(c.plan.Priority, pp.Priority)
		c.plan.MaxGPUShare = math.Min(c.plan.MaxGPUShare, pp.MaxGPUShare)
	}
}

// escalated reports whether p's requests preempt best-effort work now.
func (e *Engine) escalated(p *proc) bool {
	if !e.opts.Feedback || p.cls == nil || !p.cls.plan.HasSLO {
		return true
	}
	return p.cls.escalated
}

// feedback escalates and relaxes classes on their SLO attainment, with
// hysteresis: escalate at once below target; relax only when misses are
// under half the error budget and FeedbackHold has passed since the last
// change.
func (e *Engine) feedback() {
	if !e.opts.Feedback {
		return
	}
	for _, name := range e.classNames() {
		c := e.cls[name]
		if !c.plan.HasSLO {
			continue
		}
		n, within := c.stats.win.get(e.now)
		if n < uint64(e.opts.FeedbackMin) {
			continue
		}
		att := attainment(n, within)
		target := c.plan.Percentile / 100
		hold := uint64(e.opts.FeedbackHold)
		if hold == 0 {
			hold = uint64(c.plan.Window) / 4
		}
		switch {
		case !c.escalated && att < target:
			c.escalated, c.changed = true, e.now
			e.st.Escalations++
			e.record(Decision{GPU: -1, Class: name, Action: ActionEscalate, Level: sched.LevelSuspend,
				Reason: sloReason("attainment below target", att, target, n)})
		case c.escalated && 1-att <= (1-target)/2 && e.now-c.changed >= hold:
			c.escalated, c.changed = false, e.now
			e.st.Relaxes++
			e.record(Decision{GPU: -1, Class: name, Action: ActionRelax, Level: sched.LevelTimeslice,
				Reason: sloReason("attainment comfortably above target", att, target, n)})
		}
	}
}
