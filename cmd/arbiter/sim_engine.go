package main

import (
	"context"
	"fmt"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/policy"
	"github.com/gpu-arbiter/arbiter/policy/input"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/sim/whatif"
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

// arbiterBaseline is the arbiter baseline: the policy at dir and the
// unchanged engine in the simulator's loop. Processes are classified from
// their spec name (as comm) and the labels and env the spec gives them.
func arbiterBaseline(ctx context.Context, dir string, gpus int, gap time.Duration) (whatif.Extra, error) {
	pol, err := policy.Load(ctx, dir, nil)
	if err != nil {
		return whatif.Extra{}, fmt.Errorf("--policy %s: %w", dir, err)
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
		Controller: whatif.EngineController(plan, opts)}, nil
}

// specComm is a spec name as the kernel would keep it for comm: at most
// 15 bytes.
func specComm(name string) string {
	if len(name) > 15 {
		return name[:15]
	}
	return name
}
