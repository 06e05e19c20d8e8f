package main

import (
	"context"
	"fmt"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/sched"
)

// The engine sees policy only through its classifier and victim-chooser
// interfaces; this file plugs package policy into them, so that neither
// the engine nor the simulator carries OPA.

// policyClassifier classifies through a policy. current returns the
// policy in force (a watcher's latest good one); describe fills the
// classification input's process from what the engine knows (from /proc
// on a live node, from the spec in the simulator).
type policyClassifier struct {
	current  func() *policy.Policy
	node     func() policy.Node
	describe func(engine.ProcessInfo) (input.Process, error)
	timeout  time.Duration
}

var _ engine.Classifier = (*policyClassifier)(nil)

// Classify implements engine.Classifier: the policy's decision compiled to
// a plan. When the decision cannot be used, the plan is the policy's
// default, marked Fallback, and the error says why.
func (c *policyClassifier) Classify(p engine.ProcessInfo) (sched.Plan, string, error) {
	pol := c.current()
	proc, derr := c.describe(p)
	if derr != nil {
		// The process is gone or unreadable: classify what is known.
		proc = input.Process{PID: int(p.Key.PID), Comm: p.Comm}
	}
	proc.GPUs = p.GPUs
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	d, err := pol.Classify(ctx, policy.Input{Process: proc, Node: c.node()})
	plan := d.Compile()
	if err != nil {
		plan.Fallback = true
	}
	return plan, d.Reason, err
}

// policyVictims is the policy's control-loop entry point.
type policyVictims struct {
	current func() *policy.Policy
	node    func() policy.Node
	timeout time.Duration
}

var _ engine.VictimChooser = (*policyVictims)(nil)

var levelModes = map[sched.Level]policy.Mode{
	sched.LevelObserve: policy.ModeObserve, sched.LevelTimeslice: policy.ModeTimeslice,
	sched.LevelSuspend: policy.ModeSuspend, sched.LevelGate: policy.ModeGate,
}

// Victims implements engine.VictimChooser. A policy without a victims
// rule leaves the choice to the engine's default (engine.ErrDefaultChoice):
// every process it would suspend anyway.
func (v *policyVictims) Victims(s engine.ControlState) (engine.Victims, error) {
	pol := v.current()
	if !pol.HasVictims() {
		return engine.Victims{}, fmt.Errorf("policy revision %s: %w", pol.Revision(), engine.ErrDefaultChoice)
	}
	st := policy.State{Node: v.node(), SLO: map[string]policy.SLOState{}}
	for _, p := range s.Processes {
		st.Processes = append(st.Processes, policy.ProcessState{PID: int(p.PID), Comm: p.Comm, Class: p.Class, Priority: p.Priority,
			Mode: levelModes[p.Level], GPUs: p.GPUs, Suspended: p.Suspended, GPUShare: p.GPUShare})
	}
	for _, b := range s.Busy {
		st.Requests = append(st.Requests, policy.Request{PID: int(b.PID), Class: b.Class, GPU: b.GPU, AgeUS: int64(b.AgeNS / 1000)})
	}
	for name, c := range s.SLO {
		st.SLO[name] = policy.SLOState{Attainment: c.Attainment, Target: c.Target, LatencyMS: float64(c.Latency) / 1e6, Requests: int(c.Requests)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), v.timeout)
	defer cancel()
	d, err := pol.Victims(ctx, st)
	if err != nil {
		return engine.Victims{}, err
	}
	var out engine.Victims
	for _, x := range d.Suspend {
		out.Suspend = append(out.Suspend, engine.Suspension{PID: uint32(x.PID), GPUs: x.GPUs, Reason: x.Reason})
	}
	for _, x := range d.Throttle {
		out.Throttle = append(out.Throttle, engine.Throttle{PID: uint32(x.PID), MaxGPUShare: x.MaxGPUShare, Reason: x.Reason})
	}
	return out, nil
}
