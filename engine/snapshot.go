package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/gpu-arbiter/arbiter/sched"
)

// Action is what a decision did.
type Action string

// Actions.
const (
	ActionClassify   Action = "classify"   // a process got (or changed) its class
	ActionFallback   Action = "fallback"   // a policy decision was not used; the default applies
	ActionForget     Action = "forget"     // a process left the table
	ActionTimeslice  Action = "timeslice"  // its channel groups' timeslice was set
	ActionInterleave Action = "interleave" // its interleave level was set
	ActionSuspend    Action = "suspend"    // taken off a GPU
	ActionResume     Action = "resume"     // back on a GPU
	ActionGate       Action = "gate"       // stopped at its next launch
	ActionUngate     Action = "ungate"     // let run again
	ActionHold       Action = "hold"       // victims kept off across a short gap
	ActionEscalate   Action = "escalate"   // a class's requests now suspend best-effort work
	ActionRelax      Action = "relax"      // a class relies on timeslices alone again
	ActionArm        Action = "arm"        // gates armed to close at a latency-critical process's requests
)

// Decision is one thing the engine did, to whom, when and why.
type Decision struct {
	// Time is the engine's clock (the source's timebase, ns).
	Time  uint64      `json:"time"`
	PID   uint32      `json:"pid,omitempty"`
	Comm  string      `json:"comm,omitempty"`
	Class string      `json:"class,omitempty"`
	GPU   int         `json:"gpu"` // -1: not about one GPU
	Level sched.Level `json:"level,omitempty"`
	// Action is what was done; Reason why; Err, if set, is how the
	// enforcer failed.
	Action Action `json:"action"`
	Reason string `json:"reason"`
	Err    string `json:"error,omitempty"`
}

// ring keeps the latest decisions of one kind.
type ring struct {
	buf   []Decision
	next  int
	total uint64
}

func (r *ring) add(d Decision) {
	r.total++
	if len(r.buf) < cap(r.buf) {
		r.buf = append(r.buf, d)
		return
	}
	r.buf[r.next] = d
	r.next = (r.next + 1) % len(r.buf)
}

// list returns the ring's decisions, oldest first.
func (r *ring) list() []Decision {
	out := make([]Decision, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}

// preemption reports whether a is a per-request action (a preemption or
// its undoing), which come at request rate and are kept apart from the
// rarer decisions so that they do not push them out.
func (a Action) preemption() bool {
	switch a {
	case ActionSuspend, ActionResume, ActionGate, ActionUngate, ActionHold:
		return true
	}
	return false
}

// record keeps d in the ring of its kind.
func (e *Engine) record(d Decision) {
	d.Time = e.now
	if d.Action.preemption() && d.Err == "" {
		e.preemptions.add(d)
		return
	}
	e.decisions.add(d)
}

// recordEnforce records an enforcement call and its outcome.
func (e *Engine) recordEnforce(p *proc, gpu int, a Action, reason string, err error) {
	d := Decision{PID: p.key.PID, Comm: p.comm, Class: p.plan.Class, GPU: gpu, Level: p.level, Action: a, Reason: reason}
	if err != nil {
		e.st.EnforceErrors++
		d.Err = err.Error()
	}
	e.record(d)
}

func sloReason(what string, att, target float64, n uint64) string {
	return fmt.Sprintf("%s: %.2f%% of %d requests within target, objective %.2f%%", what, 100*att, n, 100*target)
}

// Snapshot is a consistent view of the engine at one instant, for the API,
// the console and metrics. It is immutable once published: readers share
// it without locks and never block the loop.
type Snapshot struct {
	// Time is the engine's clock when it was taken.
	Time      uint64        `json:"time"`
	Processes []ProcessView `json:"processes"`
	Classes   []ClassView   `json:"classes"`
	GPUs      []GPUView     `json:"gpus"`
	// Decisions are the latest classifications, fallbacks, registration
	// settings, escalations and relaxations, and failed enforcement;
	// Preemptions the latest suspensions, gates and their undoing. Both
	// oldest first; the totals count every one ever recorded.
	Decisions        []Decision `json:"decisions"`
	DecisionsTotal   uint64     `json:"decisions_total"`
	Preemptions      []Decision `json:"preemptions"`
	PreemptionsTotal uint64     `json:"preemptions_total"`
	Stats            Stats      `json:"stats"`
}

// ProcessView is one process in a Snapshot.
type ProcessView struct {
	PID      uint32 `json:"pid"`
	Comm     string `json:"comm"`
	Class    string `json:"class"`
	Priority int    `json:"priority"`
	// Reason is the policy's; Fallback, when set, why its own decision was
	// not used.
	Reason   string `json:"reason,omitempty"`
	Fallback string `json:"fallback,omitempty"`
	// Planned is the level the policy allows; Level the one applied; Limit
	// why Level is weaker.
	Planned         sched.Level `json:"planned"`
	Level           sched.Level `json:"level"`
	Limit           string      `json:"limit,omitempty"`
	State           State       `json:"state"`
	GPUs            []int       `json:"gpus"`
	LatencyCritical bool        `json:"latency_critical"`
	Launches        uint64      `json:"launches"`
	Copies          uint64      `json:"copies"`
	Syncs           uint64      `json:"syncs"`
	FirstSeen       uint64      `json:"first_seen"`
	LastSeen        uint64      `json:"last_seen"`
	Latency         LatencyView `json:"latency"`
}

// LatencyView is a request-latency summary.
type LatencyView struct {
	Requests uint64        `json:"requests"`
	Active   bool          `json:"active,omitempty"`
	P50      time.Duration `json:"p50_ns"`
	P99      time.Duration `json:"p99_ns"`
	Max      time.Duration `json:"max_ns"`
	// SLO, when the process or class has one: its target, and the
	// attainment over its window (-1 with no request in the window).
	HasSLO         bool          `json:"has_slo"`
	Target         time.Duration `json:"target_ns,omitempty"`
	Percentile     float64       `json:"percentile,omitempty"`
	Window         time.Duration `json:"window_ns,omitempty"`
	WindowRequests uint64        `json:"window_requests"`
	Attainment     float64       `json:"attainment"`
}

// ClassView is one class in a Snapshot.
type ClassView struct {
	Name            string `json:"name"`
	Members         int    `json:"members"`
	Priority        int    `json:"priority"`
	LatencyCritical bool   `json:"latency_critical"`
	// Escalated is whether the class's requests suspend best-effort work
	// now; never for a class that is not latency-critical, whose requests
	// suspend nothing.
	Escalated   bool        `json:"escalated"`
	MaxGPUShare float64     `json:"max_gpu_share"`
	Latency     LatencyView `json:"latency"`
}

// GPUView is one GPU in a Snapshot.
type GPUView struct {
	Index     int `json:"index"`
	Processes int `json:"processes"`
	// Active are latency-critical pids with a request in flight; Held the
	// pids held off it for them.
	Active []uint32 `json:"active"`
	Held   []uint32 `json:"held"`
}

// Snapshot returns the latest published view. Safe from any goroutine.
func (e *Engine) Snapshot() *Snapshot { return e.snap.Load() }

// publish builds and publishes a new snapshot (on the engine's goroutine).
func (e *Engine) publish() {
	s := &Snapshot{Time: e.now, Stats: e.st, Decisions: e.decisions.list(), DecisionsTotal: e.decisions.total,
		Preemptions: e.preemptions.list(), PreemptionsTotal: e.preemptions.total}
	for _, pid := range e.pids() {
		p := e.procs[pid]
		s.Processes = append(s.Processes, ProcessView{
			PID: pid, Comm: p.comm, Class: p.plan.Class, Priority: p.plan.Priority, Reason: p.reason, Fallback: p.fallback,
			Planned: p.plan.Level, Level: p.level, Limit: p.limit, State: p.state(), GPUs: slices.Clone(p.gpus),
			LatencyCritical: p.plan.LatencyCritical, Launches: p.launches, Copies: p.copies, Syncs: p.syncs,
			FirstSeen: p.firstSeen, LastSeen: p.lastSeen, Latency: e.latencyView(&p.req.stats, p.plan, p.req.busy.Active()),
		})
	}
	for _, name := range e.classNames() {
		c := e.cls[name]
		s.Classes = append(s.Classes, ClassView{Name: name, Members: c.members, Priority: c.plan.Priority,
			LatencyCritical: c.plan.LatencyCritical, Escalated: c.plan.LatencyCritical && (!(e.opts.Feedback && c.plan.HasSLO) || c.escalated),
			MaxGPUShare: c.plan.MaxGPUShare, Latency: e.latencyView(&c.stats, c.plan, false)})
	}
	idx := make([]int, 0, len(e.gpus))
	for i := range e.gpus {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	for _, i := range idx {
		gs := e.gpus[i]
		v := GPUView{Index: i, Processes: len(gs.procs), Active: []uint32{}, Held: []uint32{}}
		for p := range gs.active {
			v.Active = append(v.Active, p.key.PID)
		}
		slices.Sort(v.Active)
		for _, p := range gs.held {
			v.Held = append(v.Held, p.key.PID)
		}
		slices.Sort(v.Held)
		s.GPUs = append(s.GPUs, v)
	}
	e.snap.Store(s)
}

// latencyView is l as a snapshot shows it, for a process or class of plan
// (active: a request of it is open).
func (e *Engine) latencyView(l *latency, plan sched.Plan, active bool) LatencyView {
	p50, p99, maxNS := l.summary()
	v := LatencyView{Requests: l.total, Active: active, P50: time.Duration(p50), P99: time.Duration(p99), Max: time.Duration(maxNS),
		HasSLO: plan.HasSLO, Attainment: -1}
	if plan.HasSLO {
		v.Target, v.Percentile, v.Window = plan.LatencyTarget, plan.Percentile, plan.Window
		n, within := l.win.get(e.now)
		v.WindowRequests, v.Attainment = n, attainment(n, within)
	}
	return v
}
