package whatif

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/sim/report"
	"github.com/gpu-arbiter/arbiter/sim/scripted"
)

// Baseline names.
const (
	Exclusive         = "exclusive"
	Timeslice         = "timeslice"
	MPS               = "mps"
	Priority          = "priority"
	PriorityWait      = "priority-wait"
	PriorityRequest   = "priority-request"
	GPreempt          = "gpreempt"
	ScriptedSuspend   = "scripted-suspend"
	ScriptedTimeslice = "scripted-timeslice"
	Arbiter           = "arbiter"
)

// GPreempt's timeslices (Fan et al., "GPreempt: GPU Preemptive Scheduling
// Made General and Efficient", USENIX ATC 2025): best-effort channel
// groups get the shortest timeslice the hardware takes, latency-critical
// ones a long one, so that the GPU's own scheduler yields BE to LC within
// one BE slice plus a context switch.
const (
	gpreemptBE = time.Microsecond
	gpreemptLC = time.Second
)

// baseline is one way of sharing the GPUs: a GPU model mode, optional
// overrides of the model, fixed per-class channel-group settings, and for
// closed-loop baselines the controller that runs in the loop.
type baseline struct {
	name, description string
	mode              sim.Mode
	// granularity, when set, replaces the model's preemption granularity.
	granularity *sim.Granularity
	// timeslice, when set, gives each process a fixed timeslice by class.
	timeslice func(sim.Class) time.Duration
	// controller builds the closed loop's controller (nil: open loop).
	controller func(cfg *Config) ControllerFunc
}

// builtins lists every baseline in the order reports show them; the
// arbiter baseline is one of Config.Extra's kind, listed for its name.
func builtins() []baseline {
	kernel := sim.GranularityKernel
	return []baseline{
		{name: Exclusive, description: "each workload alone on its GPU, default timeslice"},
		{name: Timeslice, description: "all processes share by the driver's default round-robin time-slicing, equal timeslices"},
		{name: MPS, mode: sim.ModeSpatial, description: "all kernels co-run (MPS-like spatial sharing) with the modelled slowdown"},
		{name: Priority, mode: sim.ModePriority,
			description: "ideal per-kernel priority: LC preempts BE the instant it has a kernel ready, paying only the preemption cost"},
		{name: PriorityWait, mode: sim.ModePriority, granularity: &kernel,
			description: "wait-based priority: LC takes the GPU at the next BE kernel boundary, no mid-kernel preemption (REEF on NVIDIA, XSched level 1-2)"},
		{name: PriorityRequest, mode: sim.ModeRequestPriority,
			description: "ideal request-aware priority: BE off the GPU for the whole of every LC request, gaps included"},
		{name: GPreempt, timeslice: gpreemptSlices,
			description: "GPreempt preset: BE timeslice 1µs, LC 1s, set once; the GPU's time-slicing yields BE to LC"},
		{name: ScriptedSuspend, controller: scriptedController(scripted.SuspendBE),
			description: "scripted closed loop: suspend BE channel groups while any LC request is active on the GPU"},
		{name: ScriptedTimeslice, controller: scriptedController(scripted.SplitTimeslice),
			description: "scripted closed loop: BE timeslice 100µs, LC 16ms with interleave high"},
	}
}

// Names lists every baseline in the order reports show them.
func Names() []string {
	var out []string
	for _, b := range builtins() {
		out = append(out, b.name)
	}
	return append(out, Arbiter)
}

// Extra is a closed-loop baseline supplied by the caller: the arbiter
// baseline (the real policy and engine in the loop) is one. Its
// controller may report the class its policy gave each process (see
// Classifier), and the report then shows the policy's classes.
type Extra struct {
	Name        string
	Description string
	Controller  ControllerFunc
}

// resolve finds the named baselines, extras included.
func resolve(cfg *Config) ([]baseline, error) {
	names := cfg.Baselines
	if len(names) == 0 {
		names = DefaultBaselines()
	}
	known := builtins()
	for _, e := range cfg.Extra {
		if e.Name == "" || e.Controller == nil {
			return nil, fmt.Errorf("extra baseline %q: needs a name and a controller", e.Name)
		}
		if slices.ContainsFunc(known, func(b baseline) bool { return b.name == e.Name }) {
			return nil, fmt.Errorf("extra baseline %q: name already taken", e.Name)
		}
		ctl := e.Controller
		known = append(known, baseline{name: e.Name, description: e.Description,
			controller: func(*Config) ControllerFunc { return ctl }})
	}
	var out []baseline
	for i, n := range names {
		if slices.Contains(names[:i], n) {
			return nil, fmt.Errorf("baseline %q given twice", n)
		}
		j := slices.IndexFunc(known, func(b baseline) bool { return b.name == n })
		if j < 0 {
			if n == Arbiter {
				return nil, ErrNeedsPolicy
			}
			return nil, fmt.Errorf("unknown baseline %q (known: %s)", n, strings.Join(Names(), ", "))
		}
		out = append(out, known[j])
	}
	return out, nil
}

// DefaultBaselines are the baselines run when Config.Baselines is empty.
func DefaultBaselines() []string { return []string{Exclusive, Timeslice, MPS, Priority} }

// options returns the simulator options of one run of b.
func (b *baseline) options(cfg *Config) sim.Options {
	opts := cfg.Options
	opts.Mode = b.mode
	if b.granularity != nil {
		opts.Granularity = *b.granularity
	}
	if b.controller != nil {
		opts.ControlLatency = cfg.controlLatency()
	}
	return opts
}

func gpreemptSlices(c sim.Class) time.Duration {
	if c == sim.ClassLC {
		return gpreemptLC
	}
	return gpreemptBE
}

// scriptedController adapts a scripted policy to ControllerFunc.
func scriptedController(p scripted.Policy) func(*Config) ControllerFunc {
	return func(*Config) ControllerFunc {
		return func(src engine.DeadlineSource, enf engine.Enforcer, procs []Process) (Controller, error) {
			var placed []scripted.Process
			for _, pr := range procs {
				placed = append(placed, scripted.Process{PID: pr.PID, LC: pr.Class == sim.ClassLC, GPU: pr.GPU})
			}
			c, err := scripted.New(src, enf, placed, &scripted.Options{Policy: p})
			if err != nil {
				return nil, err
			}
			return scriptedRunner{c}, nil
		}
	}
}

// scriptedRunner reports a scripted controller's actions.
type scriptedRunner struct{ *scripted.Controller }

// Actions implements ActionCounter.
func (r scriptedRunner) Actions() report.Actions {
	st := r.Stats()
	return report.Actions{Events: st.Events, Suspends: st.Suspends, Resumes: st.Resumes,
		Timeslices: st.Timeslices, Interleaves: st.Interleaves}
}
