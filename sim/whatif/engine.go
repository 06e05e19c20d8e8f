package whatif

import (
	"context"
	"fmt"
	"time"

	"github.com/gpu-arbiter/arbiter/engine"
	"github.com/gpu-arbiter/arbiter/sched"
	"github.com/gpu-arbiter/arbiter/sim/report"
)

// PlanFunc classifies one simulated process for the engine, as a policy
// classifies a live one: its spec name stands for its comm.
type PlanFunc func(p Process) (sched.Plan, string, error)

// EngineController runs the real engine in the loop: events from the
// simulated node, enforcement on its GPUs, processes placed on the GPUs
// the spec gives them and classified by plan. opts configures the engine;
// its Classifier and Placement are set here.
func EngineController(plan PlanFunc, opts engine.Options) ControllerFunc {
	return func(src engine.DeadlineSource, enf engine.Enforcer, procs []Process) (Controller, error) {
		byPID := make(map[uint32]Process, len(procs))
		for _, p := range procs {
			byPID[p.PID] = p
		}
		r := &engineRunner{classes: map[uint32]string{}}
		o := opts
		o.Classifier = engine.ClassifierFunc(func(info engine.ProcessInfo) (sched.Plan, string, error) {
			p, ok := byPID[info.Key.PID]
			if !ok {
				return sched.Plan{}, "", fmt.Errorf("pid %d is not a simulated process", info.Key.PID)
			}
			pl, reason, err := plan(p)
			r.classes[p.PID] = pl.Class
			return pl, reason, err
		})
		if pl, ok := src.(engine.Placement); ok {
			o.Placement = pl
		}
		if d, ok := src.(timesliceDefault); ok && o.DefaultTimeslice == 0 {
			o.DefaultTimeslice = d.DefaultTimeslice()
		}
		e, err := engine.New(src, enf, &o)
		if err != nil {
			return nil, err
		}
		r.e = e
		return r, nil
	}
}

// timesliceDefault is a simulator whose channel groups have a timeslice
// other than the engine's default where none was set.
type timesliceDefault interface{ DefaultTimeslice() time.Duration }

// engineRunner is the engine as a closed-loop baseline's controller.
type engineRunner struct {
	e       *engine.Engine
	classes map[uint32]string
}

// Run runs the engine until the simulation ends.
func (r *engineRunner) Run() error { return r.e.Run(context.Background()) }

// Engine returns the engine, for tests that inspect its snapshot.
func (r *engineRunner) Engine() *engine.Engine { return r.e }

// Actions implements ActionCounter.
func (r *engineRunner) Actions() report.Actions {
	st := r.e.Stats()
	return report.Actions{Events: st.Events, Suspends: st.Suspends + st.Gates, Resumes: st.Resumes + st.Ungates,
		Timeslices: st.Timeslices, Interleaves: st.Interleaves}
}

// Class implements Classifier: the class the plan gave each process.
func (r *engineRunner) Class(pid uint32) (string, bool) {
	c, ok := r.classes[pid]
	return c, ok
}
