package policy

import (
	"context"
	"math"
	"sort"
	"time"
)

// Observe is a set of driver-call kinds to trace, as a bit mask the probe
// planner reads directly.
type Observe uint8

// Observe bits.
const (
	ObserveLaunch Observe = 1 << iota
	ObserveCopy
	ObserveSync
	ObserveRM
)

var observeNames = map[string]Observe{"launch": ObserveLaunch, "copy": ObserveCopy, "sync": ObserveSync, "rm": ObserveRM}

// Interleave is a channel-group interleave level, as the driver numbers it.
type Interleave uint8

// Interleave levels (NVRM SET_INTERLEAVE_LEVEL values).
const (
	InterleaveLow    Interleave = 0
	InterleaveMedium Interleave = 1
	InterleaveHigh   Interleave = 2
)

// ProcessPlan is a decision compiled for the engine's fast path: plain
// values, units resolved, no maps or strings to parse.
type ProcessPlan struct {
	PID               int
	Class             string
	Priority          int
	Mode              Mode
	Timeslice         time.Duration // 0: leave the driver's
	Interleave        Interleave
	PrePreemptionHint bool
	HasSLO            bool
	LatencyTarget     time.Duration
	Percentile        float64 // 0..100
	Window            time.Duration
	MaxGPUShare       float64 // 1 when no quota
	Observe           Observe
	// Fallback is set when the policy's own decision could not be used.
	Fallback bool
}

// Compile turns a decision into the plan for pid.
func (d Decision) Compile(pid int) ProcessPlan {
	pp := ProcessPlan{
		PID: pid, Class: d.Class, Priority: d.Priority, Mode: d.Preemption.Mode,
		Timeslice:         time.Duration(d.Preemption.TimesliceUS) * time.Microsecond,
		Interleave:        InterleaveMedium,
		PrePreemptionHint: d.Preemption.PrePreemptionHint,
		MaxGPUShare:       1,
	}
	if pp.Mode == "" {
		pp.Mode = ModeObserve
	}
	switch d.Preemption.Interleave {
	case "low":
		pp.Interleave = InterleaveLow
	case "high":
		pp.Interleave = InterleaveHigh
	}
	if d.SLO != nil {
		pp.HasSLO = true
		pp.LatencyTarget = time.Duration(d.SLO.LatencyTargetMS * float64(time.Millisecond))
		pp.Percentile = d.SLO.Percentile
		pp.Window = time.Duration(d.SLO.WindowS * float64(time.Second))
	}
	if d.Quota != nil {
		pp.MaxGPUShare = d.Quota.MaxGPUShare
	}
	for _, o := range d.Observe {
		pp.Observe |= observeNames[o]
	}
	return pp
}

// ClassPlan is what a class's processes have in common, for per-class SLO
// tracking and quotas.
type ClassPlan struct {
	Name     string
	Priority int // highest of its members
	// The strictest objective among the members: shortest target, highest
	// percentile, longest window. Members that disagree are counted in
	// Conflicts so the console can show it.
	HasSLO        bool
	LatencyTarget time.Duration
	Percentile    float64
	Window        time.Duration
	MaxGPUShare   float64 // smallest of its members
	Observe       Observe // union of its members
	Members       []int   // pids, sorted
	Conflicts     int
}

// Plan is the compiled form of every current decision. It is immutable:
// the engine reads it without locks and a new one replaces it whole.
type Plan struct {
	Revision  string
	processes map[int]ProcessPlan
	classes   map[string]*ClassPlan
}

// NewPlan compiles the plans of processes (one per pid; a later one
// replaces an earlier) for the policy at revision.
func NewPlan(revision string, processes []ProcessPlan) *Plan {
	p := &Plan{Revision: revision, processes: make(map[int]ProcessPlan, len(processes)), classes: map[string]*ClassPlan{}}
	for _, pp := range processes {
		p.processes[pp.PID] = pp
	}
	for _, pp := range p.processes {
		c, ok := p.classes[pp.Class]
		if !ok {
			c = &ClassPlan{Name: pp.Class, Priority: pp.Priority, HasSLO: pp.HasSLO, LatencyTarget: pp.LatencyTarget,
				Percentile: pp.Percentile, Window: pp.Window, MaxGPUShare: pp.MaxGPUShare}
			p.classes[pp.Class] = c
		} else {
			c.merge(pp)
		}
		c.Observe |= pp.Observe
		c.Members = append(c.Members, pp.PID)
	}
	for _, c := range p.classes {
		sort.Ints(c.Members)
	}
	return p
}

func (c *ClassPlan) merge(pp ProcessPlan) {
	if pp.HasSLO != c.HasSLO || pp.HasSLO && (pp.LatencyTarget != c.LatencyTarget || pp.Percentile != c.Percentile || pp.Window != c.Window) {
		c.Conflicts++
	}
	if pp.HasSLO {
		if !c.HasSLO || pp.LatencyTarget < c.LatencyTarget {
			c.LatencyTarget = pp.LatencyTarget
		}
		c.Percentile = math.Max(c.Percentile, pp.Percentile)
		c.Window = max(c.Window, pp.Window)
		c.HasSLO = true
	}
	c.Priority = max(c.Priority, pp.Priority)
	c.MaxGPUShare = math.Min(c.MaxGPUShare, pp.MaxGPUShare)
}

// With returns a plan with pp added or replaced; p is unchanged.
func (p *Plan) With(pp ProcessPlan) *Plan {
	all := make([]ProcessPlan, 0, len(p.processes)+1)
	for pid, x := range p.processes {
		if pid != pp.PID {
			all = append(all, x)
		}
	}
	return NewPlan(p.Revision, append(all, pp))
}

// Process returns pid's plan.
func (p *Plan) Process(pid int) (ProcessPlan, bool) {
	pp, ok := p.processes[pid]
	return pp, ok
}

// Class returns a class's plan; the returned value is a copy.
func (p *Plan) Class(name string) (ClassPlan, bool) {
	c, ok := p.classes[name]
	if !ok {
		return ClassPlan{}, false
	}
	cp := *c
	cp.Members = append([]int(nil), c.Members...)
	return cp, true
}

// Classes returns the class names, sorted.
func (p *Plan) Classes() []string {
	names := make([]string, 0, len(p.classes))
	for n := range p.classes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Len returns the number of processes planned.
func (p *Plan) Len() int { return len(p.processes) }

// ClassifyAll classifies every process and compiles the results into a
// plan, as on a policy change. Processes whose decision failed get the
// default decision, marked Fallback; their errors are returned, one per failed process.
func (pol *Policy) ClassifyAll(ctx context.Context, inputs []Input) (*Plan, []error) {
	pps := make([]ProcessPlan, 0, len(inputs))
	var errs []error
	for _, in := range inputs {
		d, err := pol.Classify(ctx, in)
		pp := d.Compile(in.Process.PID)
		if err != nil {
			pp.Fallback = true
			errs = append(errs, err)
		}
		pps = append(pps, pp)
	}
	return NewPlan(pol.Revision(), pps), errs
}
