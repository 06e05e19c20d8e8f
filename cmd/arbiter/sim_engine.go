package main

import (
	"context"
	"fmt"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/sim"
	"github.com/gpu-arbiter/arbiter/sim/whatif"
	"github.com/gpu-arbiter/arbiter/sim/workload"
)

// defaultRequestGap ends a latency-critical request: after its last
// synchronization returns, a process this long without a driver call is
// idle. Longer than the host work between a request's stages (tens of µs
// in eager frameworks), short enough that best-effort work comes back
// almost at once.
const defaultRequestGap = 200 * time.Microsecond

// simEpoch is the node time a policy sees in the simulator: fixed, so
// that runs are deterministic whatever the wall clock says.
var simEpoch = time.Date(2026, 1, 5, 12, 0, 0, 0, time.UTC)

// arbiterBaseline is the arbiter baseline: the policy at dir, once it
// passed the checks and tests the daemon puts it through, and the
// unchanged engine in the simulator's loop. Processes are classified from
// their spec name (as comm) and the labels and env the spec gives them;
// the plan returned is that classification, for classMismatches.
func arbiterBaseline(ctx context.Context, dir string, gpus int, gap time.Duration) (whatif.Extra, whatif.PlanFunc, error) {
	// Checked as the daemon checks a policy before it applies it, its
	// Rego tests included: a policy the daemon would refuse is not the
	// one a comparison should show.
	src, err := policy.Read(dir, nil)
	if err != nil {
		return whatif.Extra{}, nil, fmt.Errorf("--policy %s: %w", dir, err)
	}
	pol, err := policy.Check(ctx, src, nil)
	if err != nil {
		return whatif.Extra{}, nil, fmt.Errorf("--policy %s (the daemon would refuse it too): %w", dir, err)
	}
	node := policy.Node{Hostname: "simulated", Time: simEpoch}
	for i := range gpus {
		node.GPUs = append(node.GPUs, policy.GPU{Index: i, UUID: fmt.Sprintf("GPU-simulated-%d", i)})
	}
	current := func() *policy.Policy { return pol }
	nodeFn := func() policy.Node { return node }
	opts := engine.Options{IdleGap: gap}
	if pol.HasVictims() {
		opts.Victims = &policyVictims{current: current, node: nodeFn, timeout: policy.DefaultEvalTimeout}
	}
	plan := func(p whatif.Process) (sched.Plan, string, error) {
		in := input.Process{PID: int(p.PID), Comm: specComm(p.Name), Env: p.Env}
		if len(p.Labels) > 0 {
			in.Pod = &input.Pod{UID: "simulated-" + p.Group, Namespace: "simulated", Name: p.Group, Labels: p.Labels}
		}
		c := policyClassifier{current: current, node: nodeFn, timeout: policy.DefaultEvalTimeout,
			describe: func(engine.ProcessInfo) (input.Process, error) { return in, nil }}
		return c.Classify(engine.ProcessInfo{Key: sched.ProcessKey{PID: p.PID}, Comm: in.Comm, GPUs: []int{p.GPU}})
	}
	return whatif.Extra{Name: whatif.Arbiter, Description: "the policy in " + dir + " and the engine in the loop",
		Controller: whatif.EngineController(plan, opts)}, plan, nil
}

// classMismatches classifies each spec workload (its first process, with
// the pid the run gives it: a policy that keys on the comm may tell the
// replicas of one apart, NAME/0, NAME/1, but the spec gives them the same
// labels and env) as the arbiter baseline will, and says, for each whose
// class the policy and the spec disagree on (an LC workload the policy
// does not make latency-critical, a BE one it does), what the policy
// decided and how to give it what it reads; and where the policy failed,
// that it did. Without that, the arbiter row compares the policy against
// a workload it never saw as the spec meant it.
func classMismatches(dir string, plan whatif.PlanFunc, ws []workload.Workload) []string {
	var out []string
	seen := map[string]bool{}
	for i, w := range ws {
		if seen[w.Group] {
			continue
		}
		seen[w.Group] = true
		lc := w.Class == sim.ClassLC
		pl, reason, err := plan(whatif.Process{PID: uint32(sim.FirstPID + i), Name: w.Name, Group: w.Group, Class: w.Class, GPU: w.GPU,
			SLO: w.SLO, Labels: w.Labels, Env: w.Env})
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("--policy %s failed to classify %s (%v): the engine applies its fallback, class %s, as it would on a node; "+
				"arbiter policy eval %s --input FILE shows the failure for an input document", dir, w.Group, err, printable(pl.Class), dir))
		case pl.LatencyCritical == lc:
		case !lc:
			out = append(out, fmt.Sprintf("--policy %s makes %s, a BE workload in the spec, latency-critical (class %s; reason: %s): "+
				"its requests will preempt the LC workloads; change the labels or env the spec gives it if that is not meant",
				dir, w.Group, printable(pl.Class), printable(reason)))
		default:
			given := "the spec gives it none"
			if len(w.Labels)+len(w.Env) > 0 {
				given = "those the spec gives it do not make it latency-critical"
			}
			out = append(out, fmt.Sprintf("--policy %s does not make %s, an LC workload in the spec, latency-critical (class %s; reason: %s): "+
				"the policy classifies by the labels and env the spec gives a workload, and %s; "+
				"for rego/default add labels: {arbiter.io/class: latency-critical} to it (docs/simulator.md, \"Workload specs\")",
				dir, w.Group, printable(pl.Class), printable(reason), given))
		}
	}
	return out
}

// specComm is a spec name as the kernel would keep it for comm: at most
// 15 bytes.
func specComm(name string) string {
	if len(name) > 15 {
		return name[:15]
	}
	return name
}
