package engine

import (
	"maps"
	"slices"

	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/trace"
)

// State is what the engine is doing to a process.
type State uint8

// Process states.
const (
	StateRunning State = iota
	StateSuspended
	StateGated
)

var stateNames = [...]string{"running", "suspended", "gated"}

// String names the state.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "state(?)"
}

// MarshalText writes the state's name.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// why a process is held off a GPU: a bit per cause, so that one cause
// ending does not resume what another still holds.
const (
	holdRequest uint8 = 1 << iota // a latency-critical request is active on the GPU
	holdQuota                     // its class is over its share for this period
)

// proc is one process in the table.
type proc struct {
	key    sched.ProcessKey
	comm   string
	cgroup uint64
	plan   sched.Plan
	// given is the plan as the classifier gave it, for its class's
	// (mergePlans): a GPU share of 0 there holds the class for good,
	// where plan's 0 (none given) reads as no quota.
	given  sched.Plan
	reason string
	// fallback: why the policy's decision was not used ("" when it was).
	fallback string
	gpus     []int
	cls      *class
	// level is the enforcement the planner applies to it; limit says why
	// it is weaker than the plan's, "" when it is not.
	level sched.Level
	// gated: its enforcement is a gate rather than a channel suspend;
	// preempted: its open request's GPUs' victims have been held for it
	// (both beside level, so that the three bytes share a word).
	gated, preempted bool
	// armedLaunchOnly: only a launch opening its requests closes the
	// gates armed for it (armed, sorted; see Armer).
	armedLaunchOnly bool
	limit           string
	armed           []uint32
	// hold per GPU index position (parallel to gpus); slice the timeslice
	// the engine last set on each (µs; 0: none set).
	hold  []uint8
	slice []uint64
	// channelErr is why channel control failed on it, if it did: it is
	// then gated where the node can gate it.
	channelErr string
	firstSeen,
	lastSeen uint64
	launches, copies, syncs uint64
	req                     request
}

// lookup returns the event's process, adding and classifying it on first
// sight (a process already running when tracing began has no exec event).
func (e *Engine) lookup(ev *trace.Event) *proc {
	if p := e.last; p != nil && p.key.PID == ev.PID {
		p.count(ev)
		return p
	}
	p := e.procs[ev.PID]
	if p == nil {
		comm, ok := e.execs[ev.PID]
		delete(e.execs, ev.PID)
		if !ok && e.opts.Name != nil {
			comm = e.opts.Name(ev.PID)
		}
		p = e.add(ev.PID, comm, ev.Cgroup)
	}
	e.last = p
	p.count(ev)
	return p
}

func (p *proc) count(ev *trace.Event) {
	p.lastSeen = ev.Time
	switch ev.Kind {
	case trace.KindLaunch:
		p.launches++
	case trace.KindCopy:
		p.copies++
	case trace.KindSync:
		p.syncs++
	}
}

// maxExecs bounds the names of processes seen exec'ing that have not made
// a driver call yet (most never will: they are not CUDA processes).
const maxExecs = 1 << 16

// exec notes a new program's name; it enters the table at its first
// driver call, so that the table holds CUDA processes only.
func (e *Engine) exec(ev *trace.Event) {
	if p := e.procs[ev.PID]; p != nil {
		// exec replaced the image: a new program, classified anew, which
		// must not inherit the old one's timeslice.
		e.unsetSlices(p, "exec replaced the process image")
		e.remove(p, "exec replaced the process image")
	}
	if len(e.execs) >= maxExecs {
		clear(e.execs)
	}
	e.execs[ev.PID] = ev.Proc.CommString()
}

func (e *Engine) exit(pid uint32) {
	delete(e.execs, pid)
	if p := e.procs[pid]; p != nil {
		e.remove(p, "exited")
	}
}

// add enters a process into the table, classifies it and applies its
// registration-time enforcement.
func (e *Engine) add(pid uint32, comm string, cgroup uint64) *proc {
	p := &proc{key: sched.ProcessKey{PID: pid}, comm: comm, cgroup: cgroup, firstSeen: e.now, lastSeen: e.now,
		req: request{busy: trace.NewRequestTracker(e.opts.IdleGap, e.opts.RequestTimeout)}}
	p.gpus = []int{0}
	if e.opts.Placement != nil {
		if g := e.opts.Placement.GPUs(pid); len(g) > 0 {
			p.gpus = slices.Clone(g)
		}
	}
	p.hold, p.slice = make([]uint8, len(p.gpus)), make([]uint64, len(p.gpus))
	e.procs[pid] = p
	e.st.Processes++
	for _, g := range p.gpus {
		e.gpu(g).procs = append(e.gpu(g).procs, p)
	}
	e.classify(p, "new process")
	return p
}

// remove releases everything enforced on p and drops it from the table.
// A latency-critical process that goes mid-request ends its request, so
// that the victims held for it are let go.
func (e *Engine) remove(p *proc, why string) {
	if p.req.busy.Active() {
		e.finish(p)
	}
	if err := e.releaseProc(p, why); err != nil {
		e.st.EnforceErrors++
	}
	e.setClass(p, nil)
	for _, g := range p.gpus {
		gs := e.gpu(g)
		gs.procs = slices.DeleteFunc(gs.procs, func(q *proc) bool { return q == p })
		delete(gs.active, p)
		if p.plan.LatencyCritical {
			// The best-effort work left may need the default back.
			e.setSlices(g, func(*proc) bool { return false })
		}
	}
	if p.plan.LatencyCritical {
		e.expedite(p, false)
	}
	if a, ok := e.enf.(Armer); ok && len(p.armed) > 0 {
		e.setArmed(a, p, nil, false)
	}
	delete(e.procs, p.key.PID)
	if e.last == p {
		e.last = nil
	}
	e.armStale = true // its victims' arming, if it was one
	e.settle(false)
	e.record(Decision{PID: p.key.PID, Comm: p.comm, Class: p.plan.Class, GPU: -1, Action: ActionForget, Reason: why})
}

// classify asks the classifier for p's plan and applies it; on a class
// change the change and its reason are recorded.
func (e *Engine) classify(p *proc, why string) {
	e.st.Classifications++
	plan, reason, err := e.opts.Classifier.Classify(ProcessInfo{Key: p.key, Comm: p.comm, Cgroup: p.cgroup, GPUs: p.gpus})
	old := p.plan
	had := p.cls != nil
	p.plan, p.given, p.reason, p.fallback = plan, plan, reason, ""
	if p.plan.MaxGPUShare <= 0 || p.plan.MaxGPUShare > 1 {
		p.plan.MaxGPUShare = 1
	}
	if err != nil {
		e.st.ClassifyErrors++
		p.fallback = err.Error()
		p.plan.Fallback = true
		e.record(Decision{PID: p.key.PID, Comm: p.comm, Class: plan.Class, GPU: -1, Action: ActionFallback, Reason: "policy decision not used: " + err.Error()})
	}
	if !had || old.Class != plan.Class || old.Level != plan.Level {
		r := reason
		if had {
			r = "was " + old.Class + ": " + why + ": " + reason
		}
		e.record(Decision{PID: p.key.PID, Comm: p.comm, Class: plan.Class, GPU: -1, Action: ActionClassify, Level: plan.Level, Reason: r})
	}
	e.setClass(p, e.class(plan))
	e.plan(p, true)
	if p.plan.LatencyCritical || old.LatencyCritical {
		e.expedite(p, p.plan.LatencyCritical)
	}
	// The victim chooser's cached answer was given without this plan: a
	// new latency-critical process's GPUs were not busy in it, a new
	// preemptible process was not in it. It is asked again before the
	// next preemption, so that neither waits for the control loop to be
	// protected or held.
	if p.plan.LatencyCritical || old.LatencyCritical || p.level >= sched.LevelSuspend {
		e.victimsStale = true
	}
}

// Reclassify asks the classifier again for every live process, as after
// a policy reload, and replans those whose class or plan changed. Call it
// on the engine's goroutine (through Post).
func (e *Engine) Reclassify(c Classifier, why string) {
	if c != nil {
		e.opts.Classifier = c
	}
	// Every plan first, then each GPU's timeslices once: settled as each
	// process is, they would follow a table half old, half new.
	e.slicesLater, e.slicesDue = true, map[int]bool{}
	for _, pid := range e.pids() {
		e.classify(e.procs[pid], why)
	}
	e.slicesLater = false
	for _, g := range slices.Sorted(maps.Keys(e.slicesDue)) {
		e.setSlices(g, func(*proc) bool { return true })
	}
	if e.armStale {
		e.arm()
	}
	e.publish()
}

// pids returns the table's pids, sorted, for deterministic iteration.
func (e *Engine) pids() []uint32 {
	out := make([]uint32, 0, len(e.procs))
	for pid := range e.procs {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}
