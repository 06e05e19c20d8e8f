package engine

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/gpu-arbiter/arbiter/sched"
)

// gpuState is the planner's view of one GPU.
type gpuState struct {
	index int
	procs []*proc
	// active are the latency-critical processes with a request in flight.
	active map[*proc]struct{}
	// preempted: its victims are held for the active requests; held lists
	// them.
	preempted  bool
	held       []*proc
	harvestGen uint64
}

func (e *Engine) gpu(i int) *gpuState {
	g := e.gpus[i]
	if g == nil {
		g = &gpuState{index: i, active: map[*proc]struct{}{}}
		e.gpus[i] = g
	}
	return g
}

// plan sets p's enforcement level, the strongest its plan allows that the
// node supports for it, and with register applies registration-time
// enforcement: timeslice and interleave level.
func (e *Engine) plan(p *proc, register bool) {
	e.armStale = true
	want := p.plan.Level
	sup, why := sched.LevelSuspend, ""
	switch {
	case e.enf == nil:
		sup, why = sched.LevelObserve, "the engine only observes (no enforcer)"
	case e.sup != nil:
		sup, why = e.sup.Strongest(p.key.PID)
	}
	if p.channelErr != "" && sup == sched.LevelSuspend {
		sup, why = sched.LevelGate, "channel control failed: "+p.channelErr
	}
	level, limit := want, ""
	switch {
	case want == sched.LevelObserve:
	case sup == sched.LevelSuspend:
	case sup == sched.LevelGate && (want == sched.LevelSuspend || want == sched.LevelGate):
		level = sched.LevelGate
		if want == sched.LevelSuspend {
			limit = "gate instead of suspend: " + why
		}
	default:
		level, limit = sched.LevelObserve, fmt.Sprintf("%s not supported: %s", want, why)
	}
	if level < p.level || (level == sched.LevelObserve && p.level != sched.LevelObserve) {
		// Weaker than before: nothing may stay held on its account.
		if err := e.releaseProc(p, "replanned at "+level.String()); err != nil {
			e.st.EnforceErrors++
		}
	}
	p.level, p.limit = level, limit
	if e.enf == nil {
		return
	}
	for _, g := range p.gpus {
		// p's, and others' where p comes or goes as latency-critical;
		// replanned weaker (a suspend that failed), the default back.
		e.setSlices(g, func(q *proc) bool { return register && q == p })
	}
	if !register || level == sched.LevelObserve || level == sched.LevelGate {
		return
	}
	e.st.Interleaves++
	err := e.enf.SetInterleave(p.key.PID, p.plan.Interleave)
	e.recordEnforce(p, -1, ActionInterleave, "interleave "+p.plan.Interleave.String()+" (class "+p.plan.Class+")", err)
}

// setSlices sets the timeslice each process on gpu should have now
// (wantSlice) where it differs from the one the engine set last, and in
// any case that of a process fresh says is being planned (registration,
// a reclassification): its channel groups may be new since. While a
// reclassification of every process is under way (e.slicesLater), the
// GPU is left for it to settle once, when every plan is known.
func (e *Engine) setSlices(gpu int, fresh func(*proc) bool) {
	if e.enf == nil {
		return
	}
	if e.slicesLater {
		e.slicesDue[gpu] = true
		return
	}
	gs := e.gpu(gpu)
	lc := slices.ContainsFunc(gs.procs, func(q *proc) bool { return q.plan.LatencyCritical })
	for _, q := range gs.procs {
		i := slices.Index(q.gpus, gpu)
		us, why, back := e.wantSlice(q, q.slice[i], lc)
		if us == 0 || (us == q.slice[i] && !fresh(q)) {
			continue
		}
		e.setSlice(q, i, us, back, why)
	}
}

// setSlice sets p's timeslice on its i-th GPU and records it; back: the
// driver's default given back, by a reset where the enforcer has one
// (the engine then keeps none on p there).
func (e *Engine) setSlice(p *proc, i int, us uint64, back bool, why string) {
	e.st.Timeslices++
	var err error
	kept := us
	if r, ok := e.enf.(TimesliceResetter); ok && back {
		err, kept = r.ResetTimeslice(p.key.PID, p.gpus[i]), 0
	} else {
		err = e.enf.SetTimeslice(p.key.PID, p.gpus[i], us)
	}
	if err == nil {
		p.slice[i] = kept
	}
	e.recordEnforce(p, p.gpus[i], ActionTimeslice, why, err)
}

// unsetSlices gives p the driver's default timeslice back on every GPU
// where the engine set another: as the engine stops, or as p's image is
// replaced (the driver's channel control holds a process's timeslice for
// the groups it makes later).
func (e *Engine) unsetSlices(p *proc, why string) {
	if e.enf == nil {
		return
	}
	def := e.defaultSlice()
	for i := range p.gpus {
		if p.slice[i] != 0 && p.slice[i] != def {
			e.setSlice(p, i, def, true, fmt.Sprintf("timeslice %v, the driver's default: %s", e.opts.DefaultTimeslice, why))
		}
	}
}

// defaultSlice is the driver's default timeslice in µs.
func (e *Engine) defaultSlice() uint64 { return max(uint64(e.opts.DefaultTimeslice.Microseconds()), 1) }

// wantSlice is the timeslice (µs) p should have on a GPU where the engine
// last set the one given (0: none), with or without a latency-critical
// process there (lc), why, and whether it is the driver's default given
// back; 0: leave the one it has. It is the plan's, at a level that sets
// one, except that a short slice for work that is not latency-critical
// applies only beside latency-critical work: it is there for that work
// to wait at most one of it, and with none there it would only switch
// best-effort processes off the GPU in turn, each switch a save and a
// load of a context. Where the plan no longer asks for the slice the
// engine set (another level, no timeslice, no latency-critical process
// left), the driver's default goes back.
func (e *Engine) wantSlice(p *proc, set uint64, lc bool) (us uint64, why string, back bool) {
	def := e.defaultSlice()
	giveBack := func(because string) (uint64, string, bool) {
		if set == 0 || set == def {
			return 0, "", false
		}
		return def, fmt.Sprintf("timeslice %v, the driver's default: %s", e.opts.DefaultTimeslice, because), true
	}
	switch {
	case p.level == sched.LevelObserve || p.level == sched.LevelGate:
		return giveBack(fmt.Sprintf("level %s sets no timeslice", p.level))
	case p.plan.Timeslice <= 0:
		return giveBack(fmt.Sprintf("class %s sets no timeslice", p.plan.Class))
	}
	us = max(uint64(p.plan.Timeslice.Microseconds()), 1)
	if p.plan.LatencyCritical || us >= def || lc {
		return us, fmt.Sprintf("timeslice %v (class %s)", p.plan.Timeslice, p.plan.Class), false
	}
	return giveBack(fmt.Sprintf("class %s's %v only while a latency-critical process shares the GPU", p.plan.Class, p.plan.Timeslice))
}

// victims returns the processes to hold off gpu while a latency-critical
// request is active there: the victim chooser's cached answer, or by
// default every process at suspend or gate level that is not itself
// latency-critical.
func (e *Engine) victims(gs *gpuState) []*proc {
	if e.victimsStale && e.opts.Victims != nil {
		e.chooseVictims()
	}
	var out []*proc
	for _, v := range gs.procs {
		if v.plan.LatencyCritical || v.level < sched.LevelSuspend {
			continue
		}
		if e.victimSet != nil {
			gpus, ok := e.victimSet[v.key.PID]
			if !ok || (len(gpus) > 0 && !slices.Contains(gpus, gs.index)) {
				continue
			}
		}
		out = append(out, v)
	}
	return out
}

// preemptGPU holds gpu's victims for lc's request.
func (e *Engine) preemptGPU(g int, lc *proc) {
	gs := e.gpu(g)
	if gs.preempted {
		return
	}
	gs.preempted = true
	gs.held = gs.held[:0]
	for _, v := range e.victims(gs) {
		gs.held = append(gs.held, v)
		e.hold(v, g, holdRequest, lc)
	}
}

// releaseGPU lets gpu's victims run again.
func (e *Engine) releaseGPU(g int) {
	gs := e.gpu(g)
	if !gs.preempted {
		return
	}
	gs.preempted = false
	for _, v := range gs.held {
		e.unhold(v, g, holdRequest, "latency-critical work idle on the GPU")
	}
	gs.held = gs.held[:0]
}

// hold adds a cause for v to stay off gpu g; the first cause suspends (or
// gates) it. by is the latency-critical process it yields to, if any.
func (e *Engine) hold(v *proc, g int, cause uint8, by *proc) {
	i := slices.Index(v.gpus, g)
	if i < 0 || e.enf == nil {
		return
	}
	before := v.hold[i]
	v.hold[i] |= cause
	if before != 0 {
		return
	}
	reason := "over its class's GPU-time quota"
	if by != nil {
		reason = fmt.Sprintf("latency-critical request of pid %d (%s, class %s)", by.key.PID, by.comm, by.plan.Class)
	}
	if v.level == sched.LevelGate {
		if v.gated {
			return
		}
		e.st.Gates++
		err := e.enf.Gate(v.key.PID)
		v.gated = err == nil
		e.recordEnforce(v, g, ActionGate, reason, err)
		return
	}
	e.st.Suspends++
	err := e.enf.Suspend(v.key.PID, g)
	e.recordEnforce(v, g, ActionSuspend, reason, err)
	if err != nil {
		// Not suspended. Where the node says what it supports, replan
		// the process: channel control failing falls back to the gate.
		v.hold[i] = 0
		if e.sup == nil {
			return
		}
		v.channelErr = err.Error()
		e.plan(v, false)
		if v.level == sched.LevelGate {
			e.hold(v, g, cause, by)
		}
	}
}

// unhold removes a cause; the last one resumes (or ungates) v on g.
func (e *Engine) unhold(v *proc, g int, cause uint8, reason string) {
	i := slices.Index(v.gpus, g)
	if i < 0 || v.hold[i]&cause == 0 {
		return
	}
	v.hold[i] &^= cause
	if v.hold[i] != 0 {
		return
	}
	if v.gated {
		for _, h := range v.hold {
			if h != 0 {
				return // still held on another GPU
			}
		}
		e.st.Ungates++
		err := e.enf.Ungate(v.key.PID)
		v.gated = err != nil
		e.recordEnforce(v, g, ActionUngate, reason, err)
		return
	}
	e.st.Resumes++
	e.recordEnforce(v, g, ActionResume, reason, e.enf.Resume(v.key.PID, g))
}

// releaseProc drops every cause holding p anywhere.
func (e *Engine) releaseProc(p *proc, why string) error {
	var err error
	for i, g := range p.gpus {
		if p.hold[i] == 0 {
			continue
		}
		if p.gated {
			p.hold[i] = 0
			continue
		}
		p.hold[i] = 0
		e.st.Resumes++
		rerr := e.enf.Resume(p.key.PID, g)
		e.recordEnforce(p, g, ActionResume, why, rerr)
		if rerr != nil && err == nil {
			err = rerr
		}
	}
	if p.gated {
		e.st.Ungates++
		uerr := e.enf.Ungate(p.key.PID)
		p.gated = uerr != nil
		e.recordEnforce(p, -1, ActionUngate, why, uerr)
		if uerr != nil && err == nil {
			err = uerr
		}
	}
	for _, g := range p.gpus {
		gs := e.gpu(g)
		gs.held = slices.DeleteFunc(gs.held, func(q *proc) bool { return q == p })
	}
	return err
}

// state is what the engine is doing to p now.
func (p *proc) state() State {
	if p.gated {
		return StateGated
	}
	for _, h := range p.hold {
		if h != 0 {
			return StateSuspended
		}
	}
	return StateRunning
}

// control is the control loop, at ControlInterval: the victim chooser,
// SLO feedback, the armed gates brought up to date and the gates they
// closed settled, a new snapshot, then the observers' ticks.
func (e *Engine) control() {
	if e.opts.Victims != nil {
		e.chooseVictims()
	}
	e.feedback()
	e.arm()
	e.settle(false)
	e.publish()
	for _, t := range e.tickers {
		t.Tick(e.now)
	}
}

// chooseVictims asks the policy's control-loop entry point which
// processes yield, in the state where every GPU with latency-critical
// work is busy, and caches the answer for the fast path.
func (e *Engine) chooseVictims() {
	e.victimsStale = false
	st := ControlState{Time: e.now, SLO: map[string]ClassSLO{}}
	for _, pid := range e.pids() {
		p := e.procs[pid]
		st.Processes = append(st.Processes, ControlProcess{PID: pid, Comm: p.comm, Class: p.plan.Class, Priority: p.plan.Priority,
			Level: p.level, GPUs: p.gpus, Suspended: p.state() != StateRunning})
		if p.plan.LatencyCritical {
			for _, g := range p.gpus {
				b := BusyGPU{PID: pid, Class: p.plan.Class, GPU: g, Active: p.req.busy.Active()}
				if b.Active {
					b.AgeNS = e.now - p.req.busy.Current().Start
				}
				st.Busy = append(st.Busy, b)
			}
		}
	}
	for _, name := range e.classNames() {
		c := e.cls[name]
		if c.plan.HasSLO {
			n, within := c.stats.win.get(e.now)
			a := attainment(n, within)
			if a < 0 {
				a = 1
			}
			st.SLO[name] = ClassSLO{Attainment: a, Target: c.plan.Percentile / 100, Latency: uint64(c.plan.LatencyTarget), Requests: n}
		}
	}
	v, err := e.opts.Victims.Victims(st)
	if errors.Is(err, ErrDefaultChoice) {
		e.victimSet = nil
		e.throttle(nil)
		return
	}
	e.st.VictimCalls++
	if err != nil {
		e.st.VictimErrors++
		e.victimSet = nil
		e.record(Decision{GPU: -1, Action: ActionFallback, Reason: "victims decision not used, default choice applies: " + err.Error()})
		return
	}
	set := make(map[uint32][]int, len(v.Suspend))
	for _, s := range v.Suspend {
		set[s.PID] = append(set[s.PID], s.GPUs...)
	}
	e.victimSet = set
	e.throttle(v.Throttle)
}

func (e *Engine) classNames() []string {
	names := make([]string, 0, len(e.cls))
	for n := range e.cls {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
